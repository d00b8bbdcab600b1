"""Whether torch.compile's matmul returns a dense product or a strided view of a padded one.

    python3 bench/probes/torch_compile_strides.py 4096x50257x768 [MxNxK ...]

Prints, per shape, the output's shape, strides and whether it is contiguous, for torch.compile
(mode default) of `a @ b` in bf16 on the GPU: Inductor pads operands whose rows are not whole
16-byte units and may hand back a view of the padded product instead of compacting it.
"""
from __future__ import annotations

import sys


def main(shapes: list[str]) -> None:
    import torch

    fn = torch.compile(lambda a, b: a @ b)
    for text in shapes:
        m, n, k = map(int, text.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = fn(a, b)
        torch.cuda.synchronize()
        print(f"{text}: shape {tuple(out.shape)} strides {out.stride()} contiguous {out.is_contiguous()} "
              f"storage elements {out.untyped_storage().nbytes() // out.element_size()}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["4096x50257x768"])
