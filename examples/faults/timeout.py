"""Timeout: a long step (say, a data pre-pass) runs past the attempt's --time-limit before any checkpoint."""

import time

import trackway

run = trackway.init()
run.log({"loss": 1.0}, step=0)
time.sleep(600)  # the SIGTERM at the limit only sets run.should_stop; nothing checks it, so SIGKILL follows
run.finish()
