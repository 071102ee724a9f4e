"""Config error: the script imports a module that is not installed, before its first step."""

import trackway

run = trackway.init()
import transformerz  # noqa: E402,F401  (the typo is the fault)
