"""The torch dtype of each dtype name a Schedule's buffers and a Policy use (schedule.op's
DTYPE_BYTES_OF names them; horizon_sim never imports torch, so the mapping lives here)."""
import torch

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64, "int64": torch.int64,
               "int16": torch.int16, "uint8": torch.uint8}
