"""The runtime that interprets a Schedule: the engine (lanes, program order), what each op does,
the buffers it names, the host store, attention's inputs, the non-finite rule, the admission
(does the run fit, before anything is allocated) and Trainer (the Python API)."""
