"""Fast unit tests (no processes) for what the end-to-end runs exercise only as a whole: the
torchrun contract a rank gets, the SLURM parameters and batch script, the lr schedule, and the
step logger's reduce-and-stop protocol (on a real one-rank gloo group in this process)."""

from __future__ import annotations

import json
import os

import pytest

from workbench.config import JobConfig
from workbench.engine.env import CONTRACT, DistEnv
from workbench.engine.optim import lr_factor
from workbench.engine.rendezvous import RankContract
from workbench.launch.executors import slurm_parameters
from workbench.launch.export import sbatch_script, torchrun_command
from workbench.runfolder.layout import RunDir

pytestmark = pytest.mark.timeout(60)
TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")


@pytest.fixture
def clean_env(monkeypatch):
    """No torchrun, SLURM or submitit variables; whatever the test exports is gone afterwards (a
    MASTER_ADDR left behind would leak into every later job this test process submits)."""
    saved = dict(os.environ)
    for key in (*TORCHRUN_KEYS, "CUDA_VISIBLE_DEVICES", "_TEST_CLUSTER_"):
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(key, raising=False)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


# --- the torchrun contract -----------------------------------------------------------------------
def test_dist_env_round_trips_through_the_environment(clean_env):
    env = DistEnv(rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="node1", master_port=29400)
    env.export()
    assert {k: os.environ[k] for k in TORCHRUN_KEYS} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node1",
        "MASTER_PORT": "29400", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default"}
    assert DistEnv.from_environ() == env and not env.is_main


def test_a_missing_contract_variable_is_named(clean_env):
    clean_env.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="missing LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        DistEnv.from_environ()
    assert CONTRACT[0] == "RANK"


def test_local_rank_process_gets_loopback_rendezvous_and_its_own_gpu(clean_env, tmp_path):
    clean_env.setenv("_TEST_CLUSTER_", "local")
    clean_env.setenv("SUBMITIT_LOCAL_JOB_ID", "4242")
    for name, value in {"NTASKS": "2", "JOB_NUM_NODES": "1", "NODEID": "0", "GLOBALID": "1", "LOCALID": "1"}.items():
        clean_env.setenv(f"SUBMITIT_LOCAL_{name}", value)
    env = RankContract(local=True, port=29555, gpu_ids=["5", "7"]).export(RunDir(tmp_path))
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 2, 2)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "29555")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"  # local rank 1 -> the user's second visible GPU
    import torch.distributed as dist

    assert dist.is_torchelastic_launched() and os.environ["TORCHELASTIC_RUN_ID"] == "4242"
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # no agent hosts the store


def _slurm_rank(env, rank: int, local_rank: int, node: int) -> None:
    env.setenv("_TEST_CLUSTER_", "slurm")
    for name, value in {"JOB_ID": "77", "NTASKS": "4", "JOB_NUM_NODES": "2", "NODEID": str(node),
                        "JOB_NODELIST": "gpu[3-4]", "PROCID": str(rank), "LOCALID": str(local_rank)}.items():
        env.setenv(f"SLURM_{name}", value)


def test_slurm_rank_zero_publishes_a_port_the_others_read(clean_env, tmp_path):
    run = RunDir(tmp_path).create()
    _slurm_rank(clean_env, rank=0, local_rank=0, node=0)
    first = RankContract(local=False).export(run)
    _slurm_rank(clean_env, rank=3, local_rank=1, node=1)
    last = RankContract(local=False, rendezvous_timeout_s=5).export(run)
    assert first.master_addr == last.master_addr == "gpu3"  # the allocation's first node
    assert first.master_port == last.master_port > 0
    assert (last.rank, last.local_rank, last.local_world_size, os.environ["GROUP_RANK"]) == (3, 1, 2, "1")


def test_slurm_rank_says_where_to_look_when_rank_zero_never_publishes(clean_env, tmp_path):
    _slurm_rank(clean_env, rank=1, local_rank=1, node=0)
    with pytest.raises(TimeoutError, match="shared by all nodes"):
        RankContract(local=False, rendezvous_timeout_s=0.3).export(RunDir(tmp_path).create())


# --- SLURM parameters and the exported commands --------------------------------------------------
def test_slurm_parameters_follow_the_config():
    cfg = JobConfig.from_dict({
        "task": {"name": "charlm"}, "dist": {"nodes": 2, "procs_per_node": 4},
        "launch": {"executor": "slurm", "name": "lm", "time_limit": "02:00:00",
                   "slurm": {"partition": "gpu", "gpus_per_node": 4, "cpus_per_task": 8, "mem": "64G",
                             "sbatch_options": {"reservation": "xyz"}, "setup": ["module load cuda"]}}})
    params = slurm_parameters(cfg)
    assert params["job_name"] == "wb-lm" and params["time"] == 120 and params["signal_delay_s"] == 90
    assert (params["nodes"], params["ntasks_per_node"], params["cpus_per_task"]) == (2, 4, 8)
    assert (params["partition"], params["gpus_per_node"], params["mem"]) == ("gpu", 4, "64G")
    assert params["additional_parameters"] == {"reservation": "xyz"} and params["setup"] == ["module load cuda"]
    assert "account" not in params and "qos" not in params  # empty options are left to the cluster
    short = slurm_parameters(cfg.replace(launch__time_limit="4"))
    assert short["signal_delay_s"] == 30  # a short job is warned 30 s ahead, not 90


def test_a_time_limit_job_asks_slurm_for_the_warning_signal_and_is_requeued_on_it(tmp_path):
    """The time-limit path, as SLURM gets it: the sbatch text submitit writes for a 2-minute limit
    asks for USR2 30 s before the limit (the signal every rank checkpoints on, as the real preemption
    test on the SLURM cluster shows, where submitit requeues the job and the next attempt resumes)."""
    from submitit.slurm.slurm import _make_sbatch_string

    cfg = JobConfig.from_dict({"dist": {"nodes": 1, "procs_per_node": 2},
                               "launch": {"executor": "slurm", "time_limit": "2", "run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").create()
    params = slurm_parameters(cfg, run)
    text = _make_sbatch_string(command="python -u -m submitit.core._submit x", folder=run.logs, **params)
    lines = {line.strip() for line in text.splitlines()}
    assert {"#SBATCH --time=2", "#SBATCH --signal=USR2@30", "#SBATCH --ntasks-per-node=2",
            "#SBATCH --open-mode=append"} <= lines, text
    assert f"#SBATCH --comment='workbench run {run.root}'" in lines


def test_sbatch_script_runs_one_torchrun_per_node():
    cfg = JobConfig.from_dict({"dist": {"nodes": 2, "procs_per_node": 4},
                               "launch": {"executor": "slurm", "name": "big", "slurm": {"cpus_per_task": 2}}})
    script = sbatch_script(cfg, "job.yaml")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --cpus-per-task=8" in script  # the node's torchrun hosts 4 ranks of 2 cores
    assert "torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d" in script
    assert script.rstrip().splitlines()[-1].startswith("srun torchrun")
    single = torchrun_command(cfg.replace(dist__nodes=1, launch__executor="local"), "job.yaml", "runs/x")
    assert single == "torchrun --nnodes=1 --nproc_per_node=4 --standalone -m workbench.train job.yaml --run-dir runs/x"


# --- lr schedule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_warmup_reaches_the_peak_then_decays_to_the_floor(schedule):
    factor = lr_factor(schedule, warmup_steps=4, total_steps=14, min_ratio=0.1)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0
    end = factor(14)
    assert end == (1.0 if schedule == "constant" else pytest.approx(0.1))
    if schedule == "cosine":
        assert factor(9) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down: half the range
    if schedule == "linear":
        assert factor(9) == pytest.approx(0.55)


def test_no_warmup_and_no_room_to_decay():
    assert lr_factor("cosine", 0, 10, 0.0)(0) == 1.0
    assert lr_factor("linear", 5, 5, 0.0)(7) == 1.0  # warmup covers the whole run


# --- step logger ---------------------------------------------------------------------------------
def _written(monitor) -> list[dict]:
    import json

    monitor.metrics.close()
    return [json.loads(line) for line in monitor.run.metrics(0).read_text().splitlines()]


def test_step_logger_writes_each_record_once_with_the_reduced_loss(one_rank_group, tmp_path):
    import torch

    from workbench.engine.monitor import RankMonitor
    from workbench.engine.steplog import StepLogger

    monitor = RankMonitor(RunDir(tmp_path), 0, 1)
    logger = StepLogger(monitor, world_size=1, device="cpu")
    assert logger.log({"step": 1}, torch.tensor(0.5), stop=False) is False
    logger.poll()
    logger.log(None, torch.tensor(0.7), stop=False)  # an unlogged step only carries the stop flag
    logger.log({"step": 3}, torch.tensor(0.25), stop=False)
    logger.flush()
    logger.flush()
    assert [(r["step"], r["loss_reduced"]) for r in _written(monitor)] == [(1, 0.5), (3, 0.25)]


def test_a_stop_request_is_seen_by_the_next_logged_step(one_rank_group, tmp_path):
    import torch

    from workbench.engine.monitor import RankMonitor
    from workbench.engine.steplog import StepLogger

    logger = StepLogger(RankMonitor(RunDir(tmp_path), 0, 1), world_size=1, device="cpu")
    assert logger.log(None, torch.tensor(1.0), stop=True) is False  # asked now, reduced asynchronously
    assert logger.log(None, torch.tensor(1.0), stop=False) is True  # every rank reads it at this step
    assert logger.log(None, torch.tensor(1.0), stop=False) is False




def test_user_codes_own_init_and_destroy_find_the_group_workbench_holds(one_rank_group):
    """A submit_fn function or a pool's script calls init_process_group() and destroy_process_group()
    as under torchrun: the first finds the group up, the second leaves it for workbench to end."""
    import torch.distributed as dist

    from workbench.engine.env import borrowed_group

    real = dist.init_process_group, dist.destroy_process_group
    with borrowed_group("held {held}, asked {asked}"):
        dist.init_process_group()
        dist.init_process_group("gloo", timeout=None)
        with pytest.raises(RuntimeError, match=r"init_process_group\('nccl'\): held gloo, asked nccl"):
            dist.init_process_group("nccl")
        dist.destroy_process_group()
        assert dist.is_initialized() and dist.get_world_size() == 1
    assert (dist.init_process_group, dist.destroy_process_group) == real


def _hung_and_raised(tmp_path, hang_first: bool) -> tuple[dict, list[dict]]:
    """Rank 1 of 2 names itself hung (its heartbeat's path) and raises what its peer's stop led to, in either order."""
    from workbench.engine.hang import Stuck
    from workbench.engine.monitor import RankMonitor

    run = RunDir(tmp_path)
    monitor = RankMonitor(run, 1, 2, on_hang="fail")
    consequence = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:43177")
    steps = [lambda: monitor._name_hung("rank 1 hung: no progress for 10 s, ranks in different collectives",
                                        Stuck(10.0, True, "train.py:9 in step"), [0]),
             lambda: monitor.fail(consequence)]
    for step in steps if hang_first else steps[::-1]:
        step()
    monitor.close()
    events = [json.loads(line) for line in run.events(1).read_text().splitlines()]
    return run.read_error(1), events


def test_a_rank_that_named_itself_hung_keeps_the_hang_as_its_cause_whatever_it_raises_after(tmp_path):
    """The peer that saw rank 1's Hung error stops, which closes the connection rank 1 waits on: rank 1 then
    raises from gloo.  That exception is the hang's consequence: the error file keeps the hang (a CI run named
    rank 1's RuntimeError instead), the exception is an event marked as after it."""
    error, events = _hung_and_raised(tmp_path, hang_first=True)
    assert error["type"] == "Hung" and "different collectives" in error["message"], error
    assert [e.get("after") for e in events if e["event"] == "error"] == ["Hung"], events


def test_a_rank_that_raised_first_keeps_its_exception_when_its_heartbeat_then_finds_it_stuck(tmp_path):
    error, events = _hung_and_raised(tmp_path, hang_first=False)
    assert error["type"] == "RuntimeError" and "Connection closed" in error["message"], error
    assert [e.get("after") for e in events if e["event"] == "error"] == [None], events
