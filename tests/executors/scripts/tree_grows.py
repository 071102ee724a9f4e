"""A script without the SDK whose child process grows by 2 GiB while the parent prints its steps."""

import subprocess
import sys
import time

GROW = (
    "import time\n"
    "time.sleep(2)\n"
    "blocks = []\n"
    "for _ in range(64):\n"
    "    blocks.append(b'\\x01' * (32 << 20))\n"
    "    time.sleep(0.1)\n"
    "time.sleep(120)\n"
)
child = subprocess.Popen([sys.executable, "-c", GROW])
for step in range(1200):
    print(f"step {step} loss 1.0", flush=True)
    time.sleep(0.1)
child.kill()
