"""Measuring the machine and the executor: calibrate (a HardwareSpec), validate (predicted vs measured), probe (one configuration in a fresh process), drift."""
