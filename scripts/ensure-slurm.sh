#!/usr/bin/env bash
# Make sure a single-node Slurm answers on this machine, for tests and CI; a no-op (a fraction of a
# second) when it already does. `ensure-slurm.sh stop` stops it; `ensure-slurm.sh status` only says.
#
# Debian 12's Slurm 22.05 (slurmctld, slurmd, slurm-client) and munge, installed when missing, run
# as plain daemons: no systemd, no cgroups (proctrack/linuxproc, task/none). Measured facts behind
# every setting: ../shared/notes/slurm.md. The cluster:
#
#   node        $(hostname -s) at 127.0.0.1, CPUs=8 (config_overrides: more than the cores),
#               two fake GPUs: gres/gpu:2 over /dev/fakegpu0 and /dev/fakegpu1 (/dev/null's numbers)
#   partitions  test  (default, 1 h)  PriorityTier 1, PreemptMode REQUEUE, GraceTime 10
#               short (24 h)          PriorityTier 1, PreemptMode REQUEUE, GraceTime 10
#               high  (24 h)          PriorityTier 10: preempts test and short (preempt/partition_prio)
#   signals     preempt_send_user_signal: a victim's --signal (B:USR1@N) is sent when it is preempted;
#               KillWait 5 s between SIGTERM and SIGKILL
#   speed       batch_sched_delay=0, bf_interval=1 (sbatch -> RUNNING in ~0.5 s); cred_expire=10
#   records     jobcomp/filetxt at /var/log/slurm/jobcomp.log (`sacct -c`; 0666 so any user can read
#               it), MinJobAge=3600 (finished jobs stay in squeue/scontrol for an hour);
#               OverMemoryKill enforces --mem without cgroups (the job ends FAILED 0:9)
#
# Prints one status line on stdout. When it cannot bring Slurm up it prints one line on stderr
# saying why (and which log to read) and exits 1. Runs as root, or re-runs itself through
# `sudo -n`. Calls are serialized with a lock, so parallel test workers may all call it.
set -euo pipefail

ACTION=${1:-start}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
GRES_CONF=$CONF_DIR/gres.conf
LOG_DIR=/var/log/slurm
SPOOL_CTLD=/var/spool/slurmctld
SPOOL_D=/var/spool/slurmd
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
LOCK=/run/lock/trackway-ensure-slurm.lock
APT_LOG=/var/log/trackway-ensure-slurm-apt.log
HEADER="# Written by trackway scripts/ensure-slurm.sh: a single-node test cluster (edits are overwritten)"
GPUS=2
CPUS=8
KILLWAIT=5
GRACETIME=10
NODE=$(hostname -s)
SELF=$(readlink -f "$0")
STARTED_AT=$(date +%s.%N)

fail() { echo "ensure-slurm: $*" >&2; exit 1; }

elapsed() { awk -v a="$STARTED_AT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# /proc rather than kill -0: a user who is not root may ask whether root's daemons run.
pid_alive() { local pid; pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && [[ -d /proc/$pid ]]; }

# Retries `command...` every 0.1 s for up to `tries` times; quiet.
wait_for() {
  local tries=$1 i; shift
  for ((i = 0; i < tries; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

stop_daemon() { # name pidfile
  local pid i
  pid_alive "$2" || { rm -f "$2"; return 0; }
  pid=$(cat "$2")
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  rm -f "$2"
}

node_state() { timeout 10 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1; }

ctld_up() { timeout 10 scontrol ping 2>/dev/null | grep -q "is UP"; }

node_ready() { case $(node_state) in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac; }

status_line() {
  local version gpus
  version=$(sinfo --version 2>/dev/null | awk '{print $2}')
  echo "ensure-slurm: Slurm ${version:-?} up on node $NODE ($(node_state)), partitions" \
    "$(timeout 10 sinfo -h -o %P 2>/dev/null | paste -sd, -), $GPUS fake GPUs, in $(elapsed) s;" \
    "stop it with: $SELF stop"
}

render_config() { # writes the wanted slurm.conf and gres.conf to $1 and $2
  local mem
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  cat > "$1" <<EOF
$HEADER
ClusterName=trackway-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again after cred_expire seconds (default 120).
AuthInfo=cred_expire=10
# A preempted job gets its --signal (B:USR1@N) at once, then SIGTERM after the GraceTime.
SlurmctldParameters=preempt_send_user_signal
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
StateSaveLocation=$SPOOL_CTLD
SlurmdSpoolDir=$SPOOL_D
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
PriorityType=priority/basic
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
KillWait=$KILLWAIT
MinJobAge=3600
InactiveLimit=0
OverTimeLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
JobAcctGatherParams=OverMemoryKill
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=test  Nodes=$NODE Default=YES MaxTime=01:00:00 DefaultTime=00:10:00 PriorityTier=1  PreemptMode=REQUEUE GraceTime=$GRACETIME State=UP
PartitionName=short Nodes=$NODE Default=NO  MaxTime=24:00:00 DefaultTime=00:10:00 PriorityTier=1  PreemptMode=REQUEUE GraceTime=$GRACETIME State=UP
PartitionName=high  Nodes=$NODE Default=NO  MaxTime=24:00:00 DefaultTime=00:10:00 PriorityTier=10 PreemptMode=OFF State=UP
EOF
  printf 'AutoDetect=off\nNodeName=%s Name=gpu File=/dev/fakegpu[0-%d]\n' "$NODE" $((GPUS - 1)) > "$2"
}

# A slurm.conf neither this script nor ../shared/notes/start-slurm.sh wrote is someone's real cluster.
check_config_is_ours() {
  [[ -e $CONF ]] || return 0
  local first
  first=$(head -n 1 "$CONF")
  [[ $first == "$HEADER" || $first == "# Generated by start-slurm.sh"* ]] \
    || fail "$CONF was not written by this script (a real cluster's?); not replacing it"
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  ((${#missing[@]} == 0)) && return 0
  export DEBIAN_FRONTEND=noninteractive
  command -v apt-get >/dev/null || fail "Slurm is not installed (${missing[*]}) and there is no apt-get to install it"
  {
    apt-cache show slurmctld >/dev/null 2>&1 || apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}" \
      || { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; }
  } >"$APT_LOG" 2>&1 || fail "could not install ${missing[*]} with apt-get; see $APT_LOG"
}

start_munge() {
  if [[ ! -s /etc/munge/munge.key ]]; then
    install -d -o munge -g munge -m 700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  if ! pid_alive "$MUNGE_PID"; then
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged >/dev/null 2>&1 9>&- || fail "munged did not start; see /var/log/munge/munged.log"
  fi
  wait_for 50 bash -c 'munge -n | unmunge' || fail "munge does not answer; see /var/log/munge/munged.log"
}

make_fake_gpus() {
  local i
  for ((i = 0; i < GPUS; i++)); do
    [[ -e /dev/fakegpu$i ]] || mknod -m 666 "/dev/fakegpu$i" c 1 3 || fail "cannot create /dev/fakegpu$i (mknod)"
  done
}

# Up, with this very configuration: nothing to do (root or not).
already_up() {
  cmp -s "$NEW_CONF" "$CONF" && cmp -s "$NEW_GRES" "$GRES_CONF" && pid_alive "$MUNGE_PID" \
    && pid_alive "$CTLD_PID" && pid_alive "$SLURMD_PID" && ctld_up && node_ready
}

do_start() {
  local restart=0 i state
  install -d -m 755 "$LOG_DIR" "$SPOOL_CTLD" "$SPOOL_D" "$CONF_DIR"
  if already_up; then  # again, now under the lock: another caller may have just started it
    status_line
    return 0
  fi
  check_config_is_ours
  install_packages
  start_munge
  make_fake_gpus
  if ! cmp -s "$NEW_CONF" "$CONF" || ! cmp -s "$NEW_GRES" "$GRES_CONF"; then
    restart=1
  fi
  if ((restart)); then
    # Running jobs survive a restart of the daemons; they pick the new configuration up.
    stop_daemon slurmd "$SLURMD_PID"
    stop_daemon slurmctld "$CTLD_PID"
    install -m 644 "$NEW_CONF" "$CONF"
    install -m 644 "$NEW_GRES" "$GRES_CONF"
  fi

  if ! pid_alive "$CTLD_PID"; then
    slurmctld >/dev/null 2>&1 9>&- || fail "slurmctld did not start; see $LOG_DIR/slurmctld.log"
  fi
  wait_for 150 ctld_up || fail "slurmctld does not answer 'scontrol ping' after 15 s; see $LOG_DIR/slurmctld.log"
  # slurmctld resets the jobcomp file to 0644 when it starts; `sacct -c` opens it for writing.
  touch "$LOG_DIR/jobcomp.log"
  chmod 666 "$LOG_DIR/jobcomp.log"
  if ! pid_alive "$SLURMD_PID"; then
    slurmd >/dev/null 2>&1 9>&- || fail "slurmd did not start; see $LOG_DIR/slurmd.log"
  fi
  state=""
  for ((i = 0; i < 150; i++)); do
    state=$(node_state)
    case $state in
      idle | mixed | allocated | completing) break ;;
      down* | drain*) timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  node_ready || fail "node $NODE is not ready after 30 s (state '${state:-unknown}'); see $LOG_DIR/slurmd.log"
  status_line
}

do_stop() {
  stop_daemon slurmd "$SLURMD_PID"
  stop_daemon slurmctld "$CTLD_PID"
  stop_daemon munged "$MUNGE_PID"
  echo "ensure-slurm: stopped slurmd, slurmctld and munged in $(elapsed) s"
}

do_status() {
  if pid_alive "$CTLD_PID" && pid_alive "$SLURMD_PID" && ctld_up && node_ready; then
    status_line
  else
    echo "ensure-slurm: Slurm is not up (slurmctld $(pid_alive "$CTLD_PID" && echo running || echo stopped)," \
      "slurmd $(pid_alive "$SLURMD_PID" && echo running || echo stopped)); start it with: $SELF"
    return 1
  fi
}

case $ACTION in
  start | stop | status) ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac

# The configuration this script wants, rendered once; compared with what is in place.
NEW_CONF=$(mktemp "${TMPDIR:-/tmp}/ensure-slurm.conf.XXXXXX")
NEW_GRES=$(mktemp "${TMPDIR:-/tmp}/ensure-slurm.gres.XXXXXX")
trap 'rm -f "$NEW_CONF" "$NEW_GRES"' EXIT
render_config "$NEW_CONF" "$NEW_GRES"

if [[ $ACTION == start ]] && already_up; then
  status_line
  exit 0
fi
if [[ $ACTION == status ]]; then
  do_status
  exit
fi

# The daemons run as root: anyone else goes through sudo, when it lets them without a password.
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
    || fail "must run as root (or with passwordless sudo) to start Slurm's daemons"
  exec sudo -n "$SELF" "$@"
fi

install -d -m 755 "$(dirname "$LOCK")"
exec 9>"$LOCK"
flock -w 120 9 || fail "another ensure-slurm.sh held $LOCK for 120 s"

case $ACTION in
  start) do_start ;;
  stop) do_stop ;;
esac
