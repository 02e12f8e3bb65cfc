"""token_scan_decay_after_update (MLX) with its step compiled by mx.compile,
as MLX kernels are shipped: the planted bug (each step's decay applied
after its update) must fail, and a process that ran a compiled MLX function
must still end with the verdict's exit status (MLX can abort at
interpreter teardown, after the verdict is printed)."""

from __future__ import annotations

import functools

import mlx.core as mx

from verification import adapt, from_mlx, mixer_from_core

from .token_scan import token_scan
from .token_scan_decay_after_update import update_then_decay

GDN_KERNEL = mixer_from_core(adapt(
    from_mlx(functools.partial(token_scan, step=mx.compile(update_then_decay))),
    heads="equal", varlen=None, chunk_size=None))
