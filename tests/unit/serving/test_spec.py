"""Instance specs and the engine command lines built from them (the vLLM line as data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.serving.node_manager.spec import (
    InstanceSpec,
    LaunchTarget,
    SpecError,
    engine_command,
    launch_target,
    load_spec,
)


def pod_spec(endpoints: list[dict[str, object]], **extra: object) -> InstanceSpec:
    raw: dict[str, object] = {
        "instance_id": "decode-0",
        "backend": "vllm",
        "dp_size": 4,
        "dp_master_ip": "10.0.0.1",
        "dp_rpc_port": 13345,
        "dp_store_port": 13400,
        "num_logical_experts": 256,
        "num_redundant_experts": 32,
        "cpu_distributed_timeout_sec": 30,
        "engine_recovery_timeout_sec": 120,
        "vllm": {"model": "/models/deepseek-v3"},
        "endpoints": endpoints,
        **extra,
    }
    return InstanceSpec.model_validate(raw)


POD_A = [
    {"id": 0, "port": 8000, "device_infos": [{"device_id": "GPU-aaa", "index": 0}]},
    {"id": 1, "port": 8001, "device_infos": [{"device_id": "GPU-bbb", "index": 1}]},
]
POD_B = [
    {"id": 2, "port": 8000, "device_infos": [{"device_id": "GPU-ccc", "index": 0}]},
    {"id": 3, "port": 8001, "device_infos": [{"device_id": "GPU-ddd", "index": 1}]},
]


def expected_vllm(rank: int, *, pod_ip: str, port: int) -> list[str]:
    return [
        "vllm", "serve", "/models/deepseek-v3",
        "--host", pod_ip,
        "--port", str(port),
        "--data-parallel-size", "4",
        "--data-parallel-rank", str(rank),
        "--data-parallel-size-local", "1",
        "--api-server-count", "1",
        "--tensor-parallel-size", "1",
        "--enable-expert-parallel",
        "--enable-fault-tolerance",
        "--all2all-backend", "deepep_low_latency",
        "--enable-eplb",
        "--eplb-config.num_redundant_experts", "32",
        "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "13345",
        "--cpu-distributed-timeout-seconds", "30",
        "--fault-tolerance-config", '{"engine_recovery_timeout_sec": 120}',
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "pod_ip"),
    [(POD_A, "10.0.0.1"), (POD_B, "10.0.0.2")],
    ids=["pod-a", "pod-b"],
)
def test_vllm_command_lines_of_a_two_pod_two_rank_instance(pod: list[dict[str, object]], pod_ip: str) -> None:
    spec = pod_spec(pod)
    for endpoint in spec.endpoints:
        command = engine_command(spec, endpoint.id, pod_ip=pod_ip, cluster_token="tok")
        assert list(command.argv) == expected_vllm(endpoint.id, pod_ip=pod_ip, port=endpoint.port)
        env = dict(command.env)
        assert env["VLLM_API_KEY"] == "tok"  # the token travels in the environment, never in argv
        assert "tok" not in " ".join(command.argv)
        assert env["CUDA_VISIBLE_DEVICES"] == str(endpoint.device_infos[0].index)
        assert command.url == f"http://{pod_ip}:{endpoint.port}"
    # every pod builds the same instance-wide part: only rank, host and port differ
    a = engine_command(pod_spec(POD_A), 1, pod_ip="10.0.0.1", cluster_token=None).argv
    b = engine_command(pod_spec(POD_B), 3, pod_ip="10.0.0.2", cluster_token=None).argv
    differing = {i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}
    assert {a[i - 1] for i in differing} == {"--host", "--data-parallel-rank"}


def test_released_vllm_line_through_the_module_entry_point_without_eplb() -> None:
    spec = pod_spec(
        POD_A,
        engine_profile="vllm-0.32",
        vllm={
            "model": "/models/tiny",
            "python": "/venv/bin/python",
            "served_model_name": "tiny",
            "expert_parallel": False,
            "env": {"HF_HUB_OFFLINE": "1"},
        },
    )
    argv = list(engine_command(spec, 1, pod_ip="127.0.0.1", cluster_token="tok").argv)
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny"]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--served-model-name") == "tiny"
    assert value("--api-server-count") == "1"
    assert value("--data-parallel-rank") == "1"
    assert value("--data-parallel-size-local") == "1"
    assert value("--data-parallel-address") == "10.0.0.1"
    # vLLM refuses fault tolerance without an FT-capable all2all backend
    assert argv[argv.index("--all2all-backend") + 1] == "deepep_low_latency"
    assert "--enable-fault-tolerance" in argv
    assert json.loads(argv[argv.index("--fault-tolerance-config") + 1]) == {"engine_recovery_timeout_sec": 120}
    # EPLB and redundant experts serve only scale_down, which released vLLM does not have
    assert "--enable-eplb" not in argv
    assert "--enable-expert-parallel" not in argv
    assert dict(engine_command(spec, 1, pod_ip="127.0.0.1", cluster_token="tok").env) == {
        "HF_HUB_OFFLINE": "1",
        "VLLM_API_KEY": "tok",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_capability_follows_the_pinned_or_discovered_profile() -> None:
    from heteroflow.contracts.engine_protocol import SCALE_DOWN, VLLM_RELEASED

    auto = pod_spec(POD_A)
    assert auto.capability().protocol_profile is None
    assert auto.capability().scale_down_supported  # unknown yet: the configuration is trusted
    released = auto.capability(VLLM_RELEASED)
    assert (released.protocol_profile, released.scale_down_supported, released.retry_supported) == (
        "vllm-0.32",
        False,
        True,
    )
    assert auto.capability(SCALE_DOWN).scale_down_supported
    pinned = pod_spec(POD_A, engine_profile="vllm-0.32")
    assert pinned.capability(SCALE_DOWN).protocol_profile == "vllm-0.32"  # configuration wins


def test_operator_flags_are_appended_and_fractional_timeouts_kept() -> None:
    spec = pod_spec(
        POD_A,
        cpu_distributed_timeout_sec=7.5,
        vllm={"model": "m", "extra_args": ["--max-model-len", "8192"], "device_env": "ASCEND_RT_VISIBLE_DEVICES"},
    )
    command = engine_command(spec, 0, pod_ip="10.0.0.1", cluster_token=None)
    assert command.argv[-2:] == ("--max-model-len", "8192")
    assert command.argv[command.argv.index("--cpu-distributed-timeout-seconds") + 1] == "7.5"
    assert dict(command.env) == {"ASCEND_RT_VISIBLE_DEVICES": "0"}


SIM_RANK_2: dict[str, object] = {
    "instance_id": "i",
    "dp_size": 4,
    "dp_master_ip": "127.0.0.1",
    "dp_rpc_port": 29500,
    "dp_store_port": 29600,
    "num_logical_experts": 4,
    "num_redundant_experts": 4,
    "endpoints": [{"id": 2, "port": 8102}],
    "sim": {"python": "/py"},
}
"""A simulated pod of one rank (2) of a 4-rank instance with 4 logical and 4 redundant experts."""


def test_sim_command_line_of_a_relaunch_without_ranks_is_a_smaller_contiguous_world() -> None:
    spec = InstanceSpec.model_validate(SIM_RANK_2)
    target = launch_target(spec, master_ip="127.0.0.2", master_port=29501, retired={0, 1})
    command = engine_command(spec, 2, pod_ip="127.0.0.1", cluster_token="tok", target=target)
    argv = list(command.argv)
    assert argv[:4] == ["/py", "-m", "heteroflow.cli.main", "engine-sim"]
    pairs = dict(zip(argv[4::2], argv[5::2], strict=False))
    # originals 2 and 3 run as ranks 0 and 1 of a world of 2: a release cannot start with ranks already dead
    assert (pairs["--dp-size"], pairs["--dp-rank"]) == ("2", "0")
    assert "--dead-ranks" not in argv
    assert pairs["--master-addr"] == "127.0.0.2"
    assert pairs["--master-port"] == "29501"
    # each rank keeps its 2 slots: 2 x 2 = 4 physical experts for 4 logical ones, so no redundant expert is left
    assert (pairs["--slots-per-rank"], pairs["--num-redundant-experts"]) == ("2", "0")
    assert pairs["--host"] == "127.0.0.1"
    assert dict(command.env) == {"HETEROFLOW_CLUSTER_TOKEN": "tok"}
    with pytest.raises(SpecError, match="retired"):
        engine_command(spec, 2, pod_ip="127.0.0.1", cluster_token=None, target=LaunchTarget("h", 1, (0, 1, 3)))
    alone = launch_target(spec, master_ip="127.0.0.2", master_port=29501, retired={0, 1, 3})
    with pytest.raises(SpecError, match="1 DP ranks hold 2 expert slots, fewer than the 4 logical experts"):
        engine_command(spec, 2, pod_ip="127.0.0.1", cluster_token=None, target=alone)


def test_vllm_relaunch_renumbers_the_survivors_and_keeps_each_cards_expert_slots() -> None:
    target = launch_target(pod_spec(POD_B), master_ip="10.0.0.2", master_port=13345, retired={1})
    # 256 logical + 32 redundant over 4 ranks is 72 slots per rank: 3 x 72 = 216 cannot hold 256 logical experts
    with pytest.raises(SpecError) as refused:
        engine_command(pod_spec(POD_B), 2, pod_ip="10.0.0.2", cluster_token=None, target=target)
    assert str(refused.value) == (
        "3 DP ranks hold 216 expert slots, fewer than the 256 logical experts: the instance cannot run this small"
    )
    spec = pod_spec(POD_B, num_redundant_experts=128)  # 384 physical: 96 slots per rank
    for endpoint_id, engine_rank in ((2, 1), (3, 2)):  # members (0, 2, 3)
        argv = list(engine_command(spec, endpoint_id, pod_ip="10.0.0.2", cluster_token=None, target=target).argv)
        assert argv[argv.index("--data-parallel-size") + 1] == "3"
        assert argv[argv.index("--data-parallel-rank") + 1] == str(engine_rank)
        # 3 ranks x 96 slots = 288 physical experts, divided evenly over the EP ranks as vLLM's EPLB requires
        assert argv[argv.index("--eplb-config.num_redundant_experts") + 1] == "32"
    assert target.engine_ranks([0, 1, 3]) == [0, 2]  # a later scale_down names the engines' own ranks


def test_elastic_ep_is_launched_with_the_configured_size_as_its_ceiling() -> None:
    spec = pod_spec(POD_B, num_redundant_experts=128, enable_elastic_ep=True)
    full = list(engine_command(spec, 2, pod_ip="10.0.0.2", cluster_token=None).argv)
    flags = full[full.index("--enable-elastic-ep") :][:3]
    assert flags == ["--enable-elastic-ep", "--elastic-ep-max-dp-size", "4"]
    assert full[full.index("--data-parallel-size") + 1] == "4"
    assert "--enable-eplb" in full  # vLLM refuses elastic EP without it
    # a world relaunched without rank 1 runs as 3, and may still be grown back to the configured 4
    target = launch_target(spec, master_ip="10.0.0.2", master_port=13345, retired={1})
    smaller = list(engine_command(spec, 3, pod_ip="10.0.0.2", cluster_token=None, target=target).argv)
    assert smaller[smaller.index("--data-parallel-size") + 1] == "3"
    assert smaller[smaller.index("--elastic-ep-max-dp-size") + 1] == "4"
    # off by default: neither flag
    plain = list(engine_command(pod_spec(POD_B), 2, pod_ip="10.0.0.2", cluster_token=None).argv)
    assert "--enable-elastic-ep" not in plain
    assert "--elastic-ep-max-dp-size" not in plain


def test_the_simulator_line_carries_the_same_elastic_ep_flags() -> None:
    on = InstanceSpec.model_validate(SIM_RANK_2 | {"enable_elastic_ep": True})
    argv = list(engine_command(on, 2, pod_ip="127.0.0.1", cluster_token=None).argv)
    assert argv[argv.index("--enable-elastic-ep") :][:3] == ["--enable-elastic-ep", "--elastic-ep-max-dp-size", "4"]
    target = launch_target(on, master_ip="127.0.0.1", master_port=29500, retired={0})
    smaller = list(engine_command(on, 2, pod_ip="127.0.0.1", cluster_token=None, target=target).argv)
    assert smaller[smaller.index("--dp-size") + 1] == "3"
    assert smaller[smaller.index("--elastic-ep-max-dp-size") + 1] == "4"
    off = list(engine_command(InstanceSpec.model_validate(SIM_RANK_2), 2, pod_ip="127.0.0.1", cluster_token=None).argv)
    assert "--enable-elastic-ep" not in off


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"enable_eplb": False}, "enable_elastic_ep needs enable_eplb: vLLM supports elastic EP only with EPLB"),
        ({"engine_profile": "vllm-0.32"}, "engine_profile 'vllm-0.32' has none"),
        ({"engine_profile": "vllm-0.33"}, "engine_profile 'vllm-0.32' has none"),  # the alias names the profile
        ({"backend": "sim", "sim": {"ft_profile": "vllm-0.32"}}, "the simulator's ft_profile 'vllm-0.32' has none"),
    ],
)
def test_elastic_ep_is_refused_where_vllm_refuses_it(change: dict[str, object], message: str, tmp_path: Path) -> None:
    raw = pod_spec(POD_A).model_dump() | {"enable_elastic_ep": True} | change
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError, match=message):
        load_spec(path)
    path.write_text(json.dumps(raw | {"enable_elastic_ep": False}))
    assert not load_spec(path).enable_elastic_ep  # the same spec without elastic EP loads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"endpoints": [{"id": 0, "port": 1}, {"id": 0, "port": 2}]}, "ids repeat"),
        ({"endpoints": [{"id": 0, "port": 1}, {"id": 1, "port": 1}]}, "ports repeat"),
        ({"endpoints": [{"id": 4, "port": 1}]}, "outside"),
        ({"dead_ranks": [9]}, "outside"),
        ({"vllm": None}, "needs a 'vllm' section"),
        ({"endpoints": []}, "at least 1"),
        ({"dead_ranks": [-1]}, "greater than or equal to 0"),  # a negative rank broke every heartbeat later
        # ranks 2 and 3 alone: 2 x 72 slots cannot hold the 256 logical experts, so no engine would start
        ({"dead_ranks": [0, 1]}, "2 DP ranks hold 144 expert slots, fewer than the 256 logical experts"),
    ],
)
def test_invalid_specs_are_refused(change: dict[str, object], message: str, tmp_path: Path) -> None:
    raw = pod_spec(POD_A).model_dump() | change
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError, match=message):
        load_spec(path)


def test_a_spec_whose_every_rank_is_retired_starts_nothing_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(pod_spec(POD_A).model_dump() | {"dead_ranks": [0, 1, 2, 3]}))
    assert load_spec(path).dead_ranks == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("name", "text"),
    [("spec.json", "[" * 5000 + "]" * 5000), ("spec.toml", "a = " + "[" * 5000 + "]" * 5000)],
)
def test_a_spec_nested_too_deeply_is_refused(name: str, text: str, tmp_path: Path) -> None:
    """Both decoders recurse once per level: this was a RecursionError, not a SpecError."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError, match="nested too deeply"):
        load_spec(path)


def test_load_toml_and_capability(tmp_path: Path) -> None:
    path = tmp_path / "pod.toml"
    path.write_text(
        'instance_id = "i"\ndp_size = 2\ndp_master_ip = "127.0.0.1"\ndp_rpc_port = 1000\ndp_store_port = 1001\n'
        "num_logical_experts = 4\nnum_redundant_experts = 2\n"
        "[[endpoints]]\nid = 0\nport = 8000\n[[endpoints]]\nid = 1\nport = 8001\n"
    )
    spec = load_spec(path)
    cap = spec.capability()
    assert cap.external_lb
    assert cap.engine_ft_enabled
    assert cap.scale_down_supported
    assert not cap.auto_recovery_enabled
    assert (cap.slots_per_rank, cap.num_logical_experts, cap.num_redundant_experts) == (3, 4, 2)
    with pytest.raises(SpecError, match="nope"):
        load_spec(tmp_path / "nope.json")
