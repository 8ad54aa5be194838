"""Sweeps: a grid of configs on local processes and on a Dask LocalCluster give the same
table as running them in this process (cost clock)."""

import pandas as pd
import pytest

import workbench as wb
from tests.cost_models import SIM_COST as COST
from tests.sim.replays import small_workload
from workbench.sim.sweep import grid, local_processes, sweep

STANDIN = wb.ModelRef(standin=True)


@pytest.fixture(scope="module")
def setup():
    work = small_workload(STANDIN.load()[1], 12, seed=9)
    configs = grid({"prefill_step_size": 16}, policy=["fcfs", "shortest-prompt-first"], max_batch=[2])
    expected = wb.compare(work, configs, STANDIN, cost_model=COST, slo=wb.SLO(ttft_s=0.2))
    return work, configs, expected


def test_a_grid_names_each_point_by_its_axes_over_the_base():
    g = grid({"max_batch": 4}, policy=["fcfs", "priority"], prefill_step_size=[64])
    assert g == {
        "policy=fcfs prefill_step_size=64": {"max_batch": 4, "policy": "fcfs", "prefill_step_size": 64},
        "policy=priority prefill_step_size=64": {
            "max_batch": 4,
            "policy": "priority",
            "prefill_step_size": 64,
        },
    }
    assert grid({"max_batch": 2}) == {"base": {"max_batch": 2}}
    with pytest.raises(ValueError, match="not Scheduler options"):
        grid(batch=[1])


def test_a_sweep_on_local_processes_gives_the_in_process_table(setup):
    work, configs, expected = setup
    with local_processes(2) as pool:
        table = sweep(work, configs, STANDIN, cost_model=COST, slo=wb.SLO(ttft_s=0.2), executor=pool)
    pd.testing.assert_frame_equal(table, expected)


def test_a_sweep_on_a_dask_local_cluster_gives_the_in_process_table(setup):
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is in the dev extra")
    work, configs, expected = setup
    with (
        distributed.LocalCluster(
            processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        table = sweep(
            work, configs, STANDIN, cost_model=COST, slo=wb.SLO(ttft_s=0.2), executor=client.get_executor()
        )
    pd.testing.assert_frame_equal(table, expected)


def test_a_sweep_needs_a_picklable_model_reference(setup):
    work, configs, _ = setup
    with pytest.raises(ValueError, match="ModelRef"):
        sweep(work, configs, STANDIN.load(), cost_model=COST)
