"""Reading a spec file within limits: hostile YAML is refused with one line while it is read."""

import time

import pytest

from fleet.spec import SpecError, load_spec, read_yaml
from fleet.spec._base import MAX_MESSAGE
from fleet.spec.yamlfile import MAX_NODES, MAX_SPEC_BYTES

HEAD = "name: t\ndata: {source: digits}\n"
CPU_SECONDS = 8.0  # the work a refusal may take, in CPU time (a hang or a walk of the expanded tree takes minutes;
#                   the largest refusal takes 1.4 s alone, and reached 3.0 s beside a loaded CI's other jobs)


def alias_bomb(levels: int = 10, indent: str = "  ") -> str:
    """The "billion laughs": each level lists the one before nine times (9**levels strings)."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * 9)}]"]
    for k in range(1, levels):
        lines.append(f"{indent}l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def refused(path, match: str) -> str:
    started = time.process_time()
    with pytest.raises(SpecError, match=match) as info:
        load_spec(path)
    assert time.process_time() - started < CPU_SECONDS
    message = str(info.value)
    assert "\n" not in message and len(message) <= MAX_MESSAGE
    return message


@pytest.mark.parametrize("where", ["params", "seed", "top"])
def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path, where):
    if where == "params":
        text = HEAD + "models:\n  - family: mod:build\n    params:\n" + alias_bomb(indent="      ")
    elif where == "seed":
        text = HEAD + "models: [{family: mlp}]\nseed:\n" + alias_bomb()
    else:
        text = "bomb:\n" + alias_bomb() + HEAD + "models: [{family: mlp}]\n"
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    message = refused(path, "alias bomb")
    field = {"params": "models[0].params.l", "seed": "seed.l", "top": "bomb.l"}[where]
    assert f": {field}" in message


def test_a_recursive_alias_is_named(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text(HEAD + "models:\n  - family: mlp\n    params: &p {hidden: [*p]}\n")
    assert "models[0].params.hidden[0]: an alias refers to a value that contains it" in refused(path, "recursive")


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + "models: [{family: mlp}]\nx: '" + "a" * (10 << 20) + "'\n")
    assert f"more than {MAX_SPEC_BYTES >> 20} MiB" in refused(path, "MiB")


def test_too_many_values_stop_the_parser(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text(HEAD + "models: [{family: mlp}]\nx: [" + ",".join(["1"] * (MAX_NODES + 10)) + "]\n")
    refused(path, f"more than {MAX_NODES:,} values")


def test_deep_nesting_is_refused(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(HEAD + "models: [{family: mlp}]\nseed: " + "[" * 200 + "]" * 200 + "\n")
    refused(path, "nest")


@pytest.mark.parametrize(
    "text, where",
    [
        ("train: {lr: 0.1}\nmodels: [{family: mlp}]\ntrain: {batch_size: 8}\n", ":5:1: train: duplicate key (first at line 3)"),
        ("models:\n  - {family: mlp, params: {hidden: [8], hidden: [16]}}\n",
         "models[0].params.hidden: duplicate key"),
    ],
)
def test_a_duplicate_key_is_an_error_naming_it(tmp_path, text, where):
    path = tmp_path / "dup.yaml"
    path.write_text(HEAD + text)
    assert where in refused(path, "duplicate key")


def test_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(HEAD + "models:\n  - {family: mlp, train: &fast {lr: 0.1, batch_size: 16}}\n"
                    "  - {family: mlp, train: {<<: *fast, lr: 0.2}}\n")
    spec = load_spec(path)
    assert [(m.train.lr, m.train.batch_size) for m in spec.models] == [(0.1, 16), (0.2, 16)]


def test_binary_and_missing_files(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: \xff\xfe\x00\x01\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        read_yaml(path)
    with pytest.raises(SpecError, match="no such file"):
        read_yaml(tmp_path / "absent.yaml")


def test_a_large_wrong_value_is_shown_short(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(HEAD + "models: [{family: mlp}]\nseed: [" + ",".join(["123456789"] * 50_000) + "]\n")
    message = refused(path, "seed")
    assert len(message) < 200
