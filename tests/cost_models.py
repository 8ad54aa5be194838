"""The cost models the tests run on the cost clock (``mode="cost"``): seconds per prompt
token, per prefill chunk, per decode step and per row, as :class:`CostModel` charges them."""

from workbench.engine.levers.cost import CostModel

# 1 ms a prompt token, 100 ms a decode step plus 10 ms a row: round times for hand-checked tables
SIM_COST = CostModel(prefill_s_per_token=0.001, decode_s_per_step=0.1, decode_s_per_row=0.01)

# prefill dominates: a 300-token prompt costs ~30 decode steps, a chunk has a fixed part (pacing)
PACING_COST = CostModel(
    prefill_s_per_chunk=0.002, prefill_s_per_token=0.001, decode_s_per_step=0.010, decode_s_per_row=0.001
)
