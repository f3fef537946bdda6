"""The peers Horizon is compared with, modelled as Schedules for the same simulator: DeepSpeed
ZeRO-3 with parameters and optimizer offloaded to CPU (zero3_policy.py, zero3_builder.py)."""
