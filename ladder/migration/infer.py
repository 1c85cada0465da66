"""Infer a spec's [parse] table from the lines a training program really printed.

The lines are grouped by shape (the line with its numbers taken out): a shape printed many times with a
step number that grows is a series. The training loss is the falling number of the most frequent series
(a number labelled `loss` wins); a rarer series at a regular step interval is the evaluation; the numbers
printed last (a one-off line at the end, else the last evaluation) are the headline metric. Each number's
label is the word before it (`loss 2.3`, `loss=2.3`, `"loss": 2.3`, `loss: 2.3`), or its column's header
in a table. A tqdm bar's carriage-return updates count as what a terminal shows: the last one.

Every choice comes with why it was made, and what could not be inferred is said, never guessed silently:
the patterns are checked against the lines before they are proposed.

Must not: run anything (ladder.migration.from_run runs the program), or write a file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ladder.migration.spec import NUMBER_GROUP

NUM = re.compile(r"(?<![A-Za-z0-9_.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\d.])"
                 r"|(?<![\w.])[-+]?(?:nan|inf)(?!\w)", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STEP_WORDS = ("step", "steps", "iter", "iters", "iteration", "it", "global_step", "update", "updates", "epoch",
              "epochs", "batch", "n_iter")
NOT_A_LOSS = ("lr", "learning_rate", "time", "ms", "dt", "sec", "secs", "seconds", "elapsed", "eta", "tokens",
              "tok", "throughput", "mfu", "mem", "memory", "norm", "grad_norm", "gnorm", "speed", "samples", "s",
              "it_s", "wall", "total", "gpu", "cpu", "rank", "seed")
QUALIFIERS = ("train", "training", "val", "valid", "validation", "test", "eval", "dev", "final", "best", "top1",
              "top5", "mean", "avg")
GENERIC = ("loss", "acc", "accuracy", "error", "err", "score", "ppl", "perplexity", "bpc", "f1", "auc")
HELD_OUT = ("val", "valid", "validation", "test", "eval", "dev")
HIGHER_BETTER = ("acc", "accuracy", "f1", "auc", "bleu", "score", "precision", "recall", "top1", "top5", "map",
                 "iou", "dice", "r2", "rouge", "exact_match", "em")
LOWER_BETTER = ("loss", "ppl", "perplexity", "error", "err", "bpc", "bpd", "nll", "mse", "mae", "rmse", "wer",
                "cer", "fid")
ITEM_WORDS = ("items", "samples", "examples", "n")


@dataclass(frozen=True)
class Finding:
    """One thing inferred (or not): what, the value proposed, and why."""

    topic: str
    value: str
    why: str
    ok: bool = True


@dataclass
class Line:
    index: int
    text: str  # what a terminal shows (the last carriage-return segment)
    literals: list[str]  # len(values) + 1 pieces around the numbers
    values: list[float]
    raw: list[str]
    labels: list[str]
    carriage: bool = False  # the printed line held carriage returns (a progress bar)

    @property
    def shape(self) -> str:
        return "#".join(re.sub(r"\s+", " ", p) for p in self.literals)


@dataclass
class Series:
    lines: list[Line]
    step: int | None = None  # the column of the step number
    position: dict[int, str] = field(default_factory=dict)  # columns that place a line: step, or epoch + batch

    @property
    def labels(self) -> list[str]:
        return self.lines[0].labels

    def column(self, i: int) -> list[float]:
        return [ln.values[i] for ln in self.lines]

    def is_int(self, i: int) -> bool:
        return all(re.fullmatch(r"[-+]?\d+", ln.raw[i]) for ln in self.lines)


@dataclass
class ParseProposal:
    loss: str | None = None
    metric: str | None = None
    metric_name: str = "metric"
    direction: str | None = None
    eval: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def table(self) -> dict[str, str]:
        out = {"loss": self.loss or "", "metric": self.metric or "", "metric_name": self.metric_name,
               "direction": self.direction or "max"}
        return out | ({"eval": self.eval} if self.eval else {})


def _name(words: list[str]) -> str:
    return re.sub(r"[^a-z0-9]+", "_", "_".join(words).lower()).strip("_")


def _label(segment: str, previous: str | None) -> str:
    words = WORD.findall(segment)
    if not words:
        return f"{previous}_total" if previous and segment.strip() == "/" else ""
    last = words[-1].lower()
    if len(words) > 1 and last in GENERIC and words[-2].lower() in QUALIFIERS:
        return _name(words[-2:])
    return _name([words[-1]])


FIELD_SEPARATOR = re.compile(r"\s*\|\s*|\s{2,}|\t")


def _fields(text: str) -> list[tuple[int, int]]:
    """The spans of a table row's cells (split at |, tabs or two spaces)."""
    spans, pos = [], 0
    for m in FIELD_SEPARATOR.finditer(text):
        if text[pos:m.start()].strip():
            spans.append((pos, m.start()))
        pos = m.end()
    if text[pos:].strip():
        spans.append((pos, len(text)))
    return spans


def _header_fields(text: str) -> list[str] | None:
    """The column names of a table header line (words only), else None."""
    if NUM.search(text) or len(WORD.findall(text)) < 2:
        return None
    fields = [_name(WORD.findall(text[a:b])) for a, b in _fields(text)]
    return fields if len(fields) >= 2 else None


def read_lines(texts: Iterable[str]) -> list[Line]:
    """The numeric lines, with their numbers, labels and the literal text around them."""
    out: list[Line] = []
    header: list[str] | None = None
    for i, physical in enumerate(texts):
        segments = [s for s in physical.split("\r") if s.strip()]
        if not segments:
            continue
        text = segments[-1].rstrip()
        fields = _header_fields(text)
        if fields:
            header = fields
        matches = list(NUM.finditer(text))
        if not matches:
            continue
        literals, pos, labels = [], 0, []
        for m in matches:
            literals.append(text[pos:m.start()])
            labels.append(_label(literals[-1], labels[-1] if labels else None))
            pos = m.end()
        literals.append(text[pos:])
        cells = _fields(text)
        if header and len(cells) == len(header):  # a row of the table under the last header line
            for k, m in enumerate(matches):
                cell = next((c for c, (a, b) in enumerate(cells) if a <= m.start() < b), None)
                if cell is not None and not WORD.search(text[cells[cell][0]:m.start()]):
                    labels[k] = header[cell]
        values = [float(m.group()) for m in matches]
        out.append(Line(i, text, literals, values, [m.group() for m in matches], labels, len(segments) > 1))
    return out


def _increasing(xs: list[float]) -> bool:
    return len(xs) >= 2 and all(b > a for a, b in zip(xs, xs[1:]))


def _step_column(s: Series) -> int | None:
    ints = [i for i in range(len(s.labels)) if s.is_int(i) and _increasing(s.column(i))]
    named = [i for i in ints if s.labels[i] in STEP_WORDS or s.labels[i].endswith("step")]
    if named:
        return named[0]
    return ints[0] if ints and len(s.lines) >= 2 else None


def _epoch_batch(s: Series) -> dict[int, str]:
    """Epoch and batch columns (`Epoch [2/5], Step [100/600]`): the epoch never falls, the batch grows within
    an epoch and starts again; the batch's `/total` is the batches per epoch."""
    labels = s.labels
    epochs = [i for i, lab in enumerate(labels) if "epoch" in _words(lab) and s.is_int(i)]
    if not epochs or len(s.lines) < 3:
        return {}
    e = epochs[0]
    ev = s.column(e)
    if any(b < a for a, b in zip(ev, ev[1:])) or len(set(ev)) < 2:
        return {}
    for i in range(len(labels)):
        if i == e or not s.is_int(i) or labels[i].endswith("_total"):
            continue
        bv = s.column(i)
        within = all(b > a for (ea, a), (eb, b) in zip(zip(ev, bv), zip(ev[1:], bv[1:])) if ea == eb)
        if within and len(set(bv)) > 1:
            out = {e: "epoch", i: "batch"}
            if i + 1 < len(labels) and labels[i + 1] == f"{labels[i]}_total":
                out[i + 1] = "batches"
            return out
    return {}


def _series(lines: list[Line]) -> list[Series]:
    groups: dict[str, list[Line]] = {}
    for ln in lines:
        groups.setdefault(ln.shape, []).append(ln)
    out = []
    for group in groups.values():
        s = Series(group)
        s.step = _step_column(s)
        s.position = {s.step: "step"} if s.step is not None else _epoch_batch(s)
        out.append(s)
    return out


def _falls(xs: list[float]) -> float:
    """How much the values fall, first third to last third, relative to the first (negative: they rise)."""
    finite = [x for x in xs if math.isfinite(x)]
    k = max(1, len(finite) // 3)
    if len(finite) < 3:
        return 0.0
    first, last = sum(finite[:k]) / k, sum(finite[-k:]) / k
    return (first - last) / abs(first) if first else 0.0


def _words(label: str) -> set[str]:
    return set(label.split("_")) | {label}


def _loss_candidates(series: list[Series]) -> list[tuple[float, Series, int, str]]:
    out = []
    for s in series:
        if not s.position or len(s.lines) < 3:
            continue
        for i, label in enumerate(s.labels):
            if i in s.position or label.endswith("_total") or _words(label) & set(NOT_A_LOSS) or s.is_int(i):
                continue
            drop = _falls(s.column(i))
            score, why = 0.0, []
            if "loss" in _words(label):
                score += 4
                why.append(f"labelled `{label}`")
            if _words(label) & set(HELD_OUT):
                score -= 3
            if "train" in _words(label) or "training" in _words(label):
                score += 1
            if drop > 0.02:
                score += 2
                why.append(f"falls {drop:.0%} from the first third of the run to the last")
            elif drop < -0.02:
                score -= 3
            score += min(3.0, math.log2(len(s.lines)) / 2)
            why.append(f"printed {len(s.lines)} times with a growing "
                       + ("step" if s.step is not None else "epoch and batch"))
            out.append((score, s, i, ", ".join(why)))
    return sorted(out, key=lambda c: -c[0])


def _regular(steps: list[float]) -> bool:
    """Printed every N steps (the last gap may be shorter: a final evaluation)."""
    gaps = [round(b - a, 9) for a, b in zip(steps, steps[1:])]
    return bool(gaps) and len(set(gaps[:-1] or gaps)) == 1


def _literal(text: str) -> str:
    # re.escape also escapes characters that are plain outside a class; they read better bare
    return re.sub(r"\\([ \-#&~'\"%,/:;<=>@`!])", r"\1", re.escape(text))


def _piece(texts: list[str]) -> str:
    """A literal piece of a pattern: exact when every line has it the same; where the lines pad numbers to
    a width, each run of spaces matches any amount of whitespace."""
    if len(set(texts)) == 1:
        return _literal(texts[0])
    return "".join(r"\s*" if part.isspace() else _literal(part) for part in re.split(r"(\s+)", texts[0]) if part)


def pattern(s: Series, captures: dict[int, str], to_end: bool = False) -> str:
    """A regex for the series' lines with named groups on the captured columns (`^`-anchored; a progress
    bar's pattern is anchored at the end instead, so it reads the last update of the line)."""
    carriage = any(ln.carriage for ln in s.lines)
    to_end = to_end or carriage
    last = len(s.labels) if to_end else max(captures) + 1
    out = "" if carriage else "^"
    for i in range(last):
        out += _piece([ln.literals[i] for ln in s.lines])
        if i in captures:
            body = r"\d+" if s.is_int(i) and captures[i] in ("step", "epoch", "batch", "batches", "items") \
                else NUMBER_GROUP
            out += f"(?P<{captures[i]}>{body})"
        else:
            out += r"\d+" if s.is_int(i) else NUMBER_GROUP
    if to_end:
        out += _piece([ln.literals[-1] for ln in s.lines]) + "$"
    return out


def _matches(rx: str, lines: list[Line]) -> list[Line]:
    compiled = re.compile(rx)
    return [ln for ln in lines if compiled.search(ln.text)]


def _unique_pattern(s: Series, captures: dict[int, str], lines: list[Line]) -> tuple[str, int]:
    """The shortest pattern that reads the series' lines and no other line; (pattern, lines it also reads)."""
    for to_end in (False, True):
        rx = pattern(s, captures, to_end)
        others = [ln for ln in _matches(rx, lines) if ln not in s.lines]
        if not others:
            return rx, 0
    return rx, len(others)


TIME_UNITS = ("s", "sec", "secs", "second", "seconds", "ms", "min", "mins", "minute", "minutes", "h", "hr", "hrs",
              "hour", "hours")
TIME_WORDS = ("time", "elapsed", "took", "duration", "runtime", "walltime", "wall")


def _duration(ln: Line, i: int) -> bool:
    """The i-th number of the line is a time: a unit follows it, or the words before it name a time."""
    after = WORD.findall(ln.literals[i + 1].lower())
    if after and after[0] in TIME_UNITS and not ln.literals[i + 1].lstrip().startswith(("/", "per")):
        return True
    return bool(set(w.lower() for w in WORD.findall(ln.literals[i])) & set(TIME_WORDS))


def _direction(label: str) -> str | None:
    words = _words(label)
    if words & set(LOWER_BETTER):
        return "min"
    if words & set(HIGHER_BETTER):
        return "max"
    return None


def _eval_captures(s: Series) -> dict[int, str]:
    captures: dict[int, str] = dict(s.position)
    used = set(captures.values())
    for i, label in enumerate(s.labels):
        if i in captures or label.endswith("_total") or not label or _words(label) & set(NOT_A_LOSS):
            continue
        name = "items" if label in ITEM_WORDS and s.is_int(i) else label
        if not re.match(r"[a-z]", name) or name in used:
            continue
        used.add(name)
        captures[i] = name
    return captures


def infer_parse(texts: Iterable[str]) -> ParseProposal:
    """Propose [parse] from a program's printed lines (stdout and stderr, in order)."""
    lines = read_lines(texts)
    prop = ParseProposal()
    if not lines:
        prop.findings.append(Finding("loss", "-", "the program printed no number at all", ok=False))
        return prop
    series = _series(lines)
    candidates = _loss_candidates(series)
    loss_series: Series | None = None
    if candidates:
        _, loss_series, col, why = candidates[0]
        rx, extra = _unique_pattern(loss_series, {**loss_series.position, col: "loss"}, lines)
        prop.loss = rx
        prop.findings.append(Finding("loss", f"`{loss_series.labels[col] or 'number'}` of "
                                     f"{loss_series.lines[0].text.strip()!r}", why))
        if extra:
            prop.findings.append(Finding("loss", rx, f"the pattern also reads {extra} other lines: make it stricter",
                                         ok=False))
    else:
        prop.loss = r"^LOSS NOT FOUND: step (?P<step>\d+) loss (?P<loss>[-+.\w]+)"
        prop.findings.append(Finding("loss", "-", "no line printed three times or more carries a growing step and a "
                                     "number that could be the loss: write [parse] loss by hand", ok=False))
    eval_series = _eval_series(series, loss_series)
    if eval_series is not None:
        prop.eval, _ = _unique_pattern(eval_series, _eval_captures(eval_series), lines)
        steps = [int(v) for v in eval_series.column(eval_series.step)] if eval_series.step is not None else []
        prop.findings.append(Finding("eval", eval_series.lines[0].text.strip(),
                                     f"printed {len(eval_series.lines)} times, at steps {_short(steps)}"))
    _metric(prop, lines, series, loss_series, eval_series)
    return prop


def _short(xs: list[int]) -> str:
    return ", ".join(map(str, xs)) if len(xs) <= 6 else ", ".join(map(str, xs[:3])) + ", ..., " + str(xs[-1])


def _eval_series(series: list[Series], loss_series: Series | None) -> Series | None:
    """A rarer series at a regular step interval with held-out numbers; else the loss lines themselves when
    they carry held-out numbers (a program that logs only at evaluations)."""
    best, best_score = None, 0.0
    for s in series:
        if s is loss_series or s.step is None or len(s.lines) < 2:
            continue
        held = sum(1 for lab in s.labels if _words(lab) & set(HELD_OUT))
        score = held * 2 + (1 if _regular(s.column(s.step)) else 0) + (1 if any(
            _words(lab) & (set(GENERIC) | set(HIGHER_BETTER)) for lab in s.labels) else 0)
        if score > best_score:
            best, best_score = s, score
    if best is None and loss_series is not None and any(_words(lab) & set(HELD_OUT) for lab in loss_series.labels):
        return loss_series
    return best if best_score >= 2 else None


def _metric(prop: ParseProposal, lines: list[Line], series: list[Series], loss_series: Series | None,
            eval_series: Series | None) -> None:
    in_series = {id(ln) for s in series if len(s.lines) > 1 for ln in s.lines}
    last_series_line = max((ln.index for s in series if len(s.lines) > 1 for ln in s.lines), default=-1)
    final = [ln for ln in lines if id(ln) not in in_series and ln.index > last_series_line]
    options: list[tuple[float, Line, int, str]] = []
    for rank, ln in enumerate(final):
        line_words = [w.lower() for w in WORD.findall(ln.text)]
        named = next((w for w in line_words if _direction(w)), None)  # `Accuracy of the net on 10000 images: 97.1`
        for i, label in enumerate(ln.labels):
            if label.endswith("_total") or (label and _words(label) & set(NOT_A_LOSS)):
                continue
            own = bool(label and _direction(label))
            if not own and _duration(ln, i):  # `Finished training in 7.49 seconds` is not the result
                continue
            name = label if own or not named else named
            integer = re.fullmatch(r"[-+]?\d+", ln.raw[i]) is not None
            score = rank * 0.1 + (3 if _words(name) & set(HIGHER_BETTER) else 0) + \
                (2 if _words(name) & set(LOWER_BETTER) else 0) + (1 if _words(name) & set(HELD_OUT) else 0) + \
                (1 if own else 0) - (2 if integer else 0) + (0.5 if i == len(ln.labels) - 1 else 0)
            if name:
                options.append((score, ln, i, name))
    if options:
        _, ln, i, name = max(options, key=lambda o: o[0])
        s = Series([ln])
        prop.metric = pattern(s, {i: "value"})
        prop.metric_name = name
        others = [f"{o[3]}={o[1].raw[o[2]]}" for o in options if (o[1], o[2]) != (ln, i)]
        why = "printed once, after the last training and evaluation lines"
        if others:
            why += f" (also printed there: {', '.join(others[:4])}; edit [parse] metric to use one)"
        prop.findings.append(Finding("metric", f"{ln.labels[i]} = {ln.raw[i]} in {ln.text.strip()!r}", why))
    elif eval_series is not None:
        cols = [i for i in _eval_captures(eval_series) if i not in eval_series.position]
        scored = sorted(cols, key=lambda i: -(2 * bool(_words(eval_series.labels[i]) & set(HELD_OUT))
                                             + bool(_direction(eval_series.labels[i]))))
        if scored:
            i = scored[0]
            prop.metric = pattern(eval_series, {i: "value"})
            prop.metric_name = eval_series.labels[i]
            prop.findings.append(Finding("metric", f"{eval_series.labels[i]} of the last evaluation line",
                                         "no line after the last evaluation: the last evaluation's number is the "
                                         "result (the parser keeps the last match)"))
    if prop.metric is None:
        prop.metric = r"^METRIC NOT FOUND: (?P<value>[-+.\w]+)"
        prop.findings.append(Finding("metric", "-", "no number printed at the end and no evaluation lines: make the "
                                     "program print its result, or write [parse] metric by hand", ok=False))
        return
    prop.direction = _direction(prop.metric_name)
    if prop.direction is None:
        prop.direction = "max"
        prop.findings.append(Finding("direction", "max", f"could not tell from the name `{prop.metric_name}` "
                                     "whether higher is better: check `direction`", ok=False))
    else:
        prop.findings.append(Finding("direction", prop.direction, f"`{prop.metric_name}` is "
                                     + ("an error or a loss" if prop.direction == "min" else "a score")))
