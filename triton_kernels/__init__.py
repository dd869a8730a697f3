"""Triton kernels for the fused compressed exchange, installed as ``lightning_embark.kernels``.

Each kernel comes as a private ``@triton.jit`` function, a public launcher and a
pure-torch reference op that is both the test oracle and the CPU path.
"""
