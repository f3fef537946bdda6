"""The executor's commands: train, calibrate, validate. Importing these does not import torch (the `horizon` entry point builds its parser from them)."""
