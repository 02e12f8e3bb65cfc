"""chunked_wy with a planted bug in its hand-written backward: the state
cotangent is not carried from a chunk into the one before it (every chunk
is handed the final state's cotangent). The forward is right; only the
gradients of calls longer than one chunk are wrong. What the suite must
kill through the torch bridge: a bug in a torch kernel's own backward."""

from __future__ import annotations

import functools

from verification import adapt, from_torch, mixer_from_core

from .chunked_wy import ChunkedDeltaRule, chunk_gated_delta_rule, chunkwise_backward


def final_state_cotangent(d_entering, d_leaving):
    """The bug: the chunk before is handed this chunk's own cotangent."""
    del d_entering
    return d_leaving


class NotCarried(ChunkedDeltaRule):
    @staticmethod
    def backward(ctx, d_o, d_state):
        return chunkwise_backward(ctx, d_o, d_state, carry=final_state_cotangent)


GDN_KERNEL = mixer_from_core(adapt(
    from_torch(functools.partial(chunk_gated_delta_rule, function=NotCarried)),
    heads="equal", varlen=None))

