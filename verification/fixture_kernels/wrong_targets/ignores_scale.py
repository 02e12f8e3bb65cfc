"""Wrong target: gdn_kernels' XLA twin that takes scale= and ignores it,
every call running at the default Dk**-0.5 (as a widely used torch op
does). It declares nothing, so it claims scale= like every other argument
of the contract: the properties' cases at a scale= other than the default
(strategies.lattice.SCALE_FACTORS) must fail it."""

import functools

from gdn_kernels import api


def _scale_ignored(op):
    @functools.wraps(op)
    def call(*args, scale=None, **kwargs):
        del scale                      # the bug: the argument is accepted and dropped
        return op(*args, **dict(kwargs, impl="xla"))
    return call


gated_delta_rule = _scale_ignored(api.gated_delta_rule)
gdn_decoupled_conv1d = _scale_ignored(api.gdn_decoupled_conv1d)
