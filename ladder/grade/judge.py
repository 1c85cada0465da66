"""The optional LLM judge of `ladder grade`: the Anthropic API reads the port's diff, its log and the
rule-based verdicts against the protocol's rubric (protocols/prompts/judge.md) and answers pass, reject
or unsure with its reasons.

Owns: the judge's prompt and the parsing of its answer. Must not: replace a rule-based judge (its verdict
is journaled beside them, and it can only reject what the rules passed), or run without being asked (no
client and no ANTHROPIC_API_KEY: no judge). Tested through the SDK's HTTP transport, with no network.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ladder.journal.entries import JudgeVerdict
from ladder.migration.protocol import PROTOCOLS_DIR, GradeRules

MAX_EVIDENCE_CHARS = 60_000
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def judge_prompt(rules: GradeRules, evidence: dict[str, Any]) -> str:
    rubric = (PROTOCOLS_DIR / rules.judge_rubric).read_text()
    body = json.dumps(evidence, indent=1, default=str)
    if len(body) > MAX_EVIDENCE_CHARS:
        body = body[:MAX_EVIDENCE_CHARS] + "\n... (evidence cut here)"
    return f"{rubric}\n<evidence>\n{body}\n</evidence>"


def parse_verdict(text: str, model: str) -> JudgeVerdict:
    m = _OBJECT.search(text)
    try:
        data = json.loads(m.group(0)) if m else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("verdict") not in ("pass", "reject", "unsure"):
        return JudgeVerdict(model=model, verdict="unsure", error=f"unreadable answer: {text[:300]!r}")
    reasons = data.get("reasons") if isinstance(data.get("reasons"), list) else []
    return JudgeVerdict(model=model, verdict=data["verdict"], reasons=[str(r)[:500] for r in reasons][:10])


def llm_judge(rules: GradeRules, evidence: dict[str, Any], client: Any | None = None) -> JudgeVerdict | None:
    """The judge's verdict; None when no judge is available (no client, no ANTHROPIC_API_KEY)."""
    if client is None and not os.environ.get("ANTHROPIC_API_KEY"):
        return None
    import anthropic

    client = client or anthropic.Anthropic()
    try:
        msg = client.messages.create(model=rules.judge_model, max_tokens=rules.judge_max_tokens,
                                     messages=[{"role": "user", "content": judge_prompt(rules, evidence)}])
    except anthropic.APIError as e:
        return JudgeVerdict(model=rules.judge_model, verdict="unsure", error=f"{type(e).__name__}: {e}")
    text = "".join(getattr(b, "text", "") for b in msg.content)
    return parse_verdict(text, rules.judge_model)
