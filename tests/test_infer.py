"""`ladder init --from-run`'s log reading on synthetic logs of the styles real programs print.

Each proposal is judged by what ladder's own parser then reads with it: the loss curve, the evaluations
and the metric must be the numbers the program printed, and nothing else.
"""

from __future__ import annotations

import json
import math

import pytest

from ladder.migration.infer import infer_parse
from ladder.migration.spec import ParseSpec
from ladder.runs.parse import OutputParser


def _losses(n: int) -> list[float]:
    return [round(2.5 * math.exp(-i / 40) + 0.3 + 0.02 * math.sin(i), 4) for i in range(1, n + 1)]


def _read(lines: list[str]):
    prop = infer_parse(lines)
    parser = OutputParser(ParseSpec(**prop.table()))
    for i, line in enumerate(lines):
        parser.feed(line, float(i))
    return prop, parser


def _assert_reads(prop, parser, steps, losses, metric, name, direction) -> None:
    assert [p.step for p in parser.curve] == steps and [p.loss for p in parser.curve] == losses, prop.loss
    assert parser.metric == metric and prop.metric_name == name and prop.direction == direction, prop.metric
    assert all(f.ok for f in prop.findings), prop.findings


def test_key_value_lines() -> None:
    losses = _losses(30)
    lines = ["using device cpu, 1 thread"]
    for i, loss in enumerate(losses, 1):
        lines.append(f"step={i * 10} loss={loss} lr=0.001 grad_norm=1.{i % 10}")
        if i % 10 == 0:
            lines.append(f"eval step={i * 10} val_loss={loss + 0.1:.4f} val_acc=0.{50 + i}")
    lines.append("final test_acc=0.8123 test_loss=0.5511")
    prop, parser = _read(lines)
    _assert_reads(prop, parser, list(range(10, 310, 10)), losses, 0.8123, "test_acc", "max")
    assert [e.step for e in parser.evals] == [100, 200, 300] and parser.evals[-1].values["val_acc"] == 0.8
    assert "grad_norm" not in prop.loss and "test_loss=0.5511" in prop.findings[-2].why


def test_padded_tables_with_a_header() -> None:
    losses = _losses(25)
    lines = ["  step        loss          lr      ms", "-" * 40]
    lines += [f"{i * 40:>6d}  {loss:>10.4f}  {1e-3 / i:>10.2e}  {12.5 + i:>6.1f}" for i, loss in enumerate(losses, 1)]
    lines += ["done.", "| split | loss | acc |", "| test | 0.4410 | 0.9012 |"]
    prop, parser = _read(lines)
    _assert_reads(prop, parser, [i * 40 for i in range(1, 26)], losses, 0.9012, "acc", "max")
    assert r"\s*" in prop.loss  # the step column's width grows from 2 to 4 digits


def test_tqdm_postfix_reads_the_last_update_of_each_bar() -> None:
    epochs = _losses(8)
    lines = []
    for e, loss in enumerate(epochs, 1):
        updates = [f"Epoch {e}:   0%|          | 0/32 [00:00<?, ?it/s]"]
        updates += [f"Epoch {e}:  {k * 25}%|{'#' * (k * 2)}{' ' * (10 - 2 * k)}| {k * 8}/32 [00:0{k}<00:0{4 - k}, "
                    f"{30 + k}.2it/s, loss={loss + 0.5 / k:.4f}]" for k in (1, 2, 3)]
        updates.append(f"Epoch {e}: 100%|##########| 32/32 [00:04<00:00, 33.9it/s, loss={loss:.4f}]")
        lines.append("\r".join(updates))
        lines.append(f"epoch {e} val_acc {0.6 + e / 100:.4f}")
    lines.append("Test accuracy: 0.6913")
    prop, parser = _read(lines)
    _assert_reads(prop, parser, list(range(1, 9)), epochs, 0.6913, "test_accuracy", "max")
    assert prop.loss.endswith("$") and not prop.loss.startswith("^")


def test_json_lines() -> None:
    losses = _losses(20)
    lines = []
    for i, loss in enumerate(losses, 1):
        lines.append(json.dumps({"step": i * 5, "loss": loss, "lr": 0.01, "tokens_per_s": 1234.5 + i}))
        if i % 5 == 0:
            lines.append(json.dumps({"step": i * 5, "split": "val", "val_loss": loss + 0.05, "val_ppl": 9.1 - i / 10}))
    prop, parser = _read(lines)
    _assert_reads(prop, parser, list(range(5, 105, 5)), losses, round(losses[-1] + 0.05, 4), "val_loss", "min")
    assert len(parser.evals) == 4 and parser.evals[0].values["val_ppl"] == 8.6


def test_epoch_and_batch_counters() -> None:
    losses = _losses(12)
    lines = [f"Epoch [{e}/3], Step [{b * 100}/400], Loss: {losses[(e - 1) * 4 + b - 1]:.4f}"
             for e in (1, 2, 3) for b in (1, 2, 3, 4)]
    lines.append("Accuracy of the network on the 10000 test images: 97.12 %")
    prop, parser = _read(lines)
    assert "(?P<epoch>" in prop.loss and "(?P<batch>" in prop.loss and "(?P<batches>" in prop.loss
    assert [p.loss for p in parser.curve] == losses and parser.metric == 97.12 and prop.direction == "max"
    assert [p.step for p in parser.curve][:5] == [100, 200, 300, 400, 500]


def test_what_cannot_be_inferred_is_said() -> None:
    prop = infer_parse(["loading", "training...", "done"])
    assert not prop.findings[0].ok and "no number" in prop.findings[0].why
    lines = [f"step {i} loss {2.0 - i / 100:.3f}" for i in range(1, 40)] + ["result: 17"]
    prop = infer_parse(lines)
    direction = [f for f in prop.findings if f.topic == "direction"]
    assert direction and not direction[0].ok and "whether higher is better" in direction[0].why
    ParseSpec(**prop.table())  # still a valid spec to edit


@pytest.mark.parametrize("line, group", [("val loss 2.5050; best 2.4", "2.5050"), ("acc: 93.5%", "93.5"),
                                          ("step 10/200 loss 1.0", "10")])
def test_proposed_number_groups_stop_at_punctuation(line: str, group: str) -> None:
    import re

    from ladder.migration.spec import NUMBER_GROUP

    number = re.compile(NUMBER_GROUP)
    assert number.search(line[line.index(group):]).group() == group


@pytest.mark.parametrize("last", ["Finished training in 7.49 seconds", "took 12.5s", "elapsed time: 88.1"])
def test_a_time_printed_at_the_end_is_not_proposed_as_the_metric(last: str) -> None:
    losses = _losses(20)
    lines = [f"[1, {i * 100:5d}] loss: {loss:.3f}" for i, loss in enumerate(losses, 1)] + [last]
    prop = infer_parse(lines)
    assert prop.metric_name == "metric" and "METRIC NOT FOUND" in prop.metric, (prop.metric_name, prop.metric)
    assert any(f.topic == "metric" and not f.ok for f in prop.findings)
    # a result printed beside it is still found
    prop = infer_parse(lines[:-1] + ["Accuracy of the network on the 10000 test images: 54 %", last])
    assert prop.metric_name == "accuracy" and prop.direction == "max", prop.metric_name
