"""`ladder grade`: grading a finished migration the way the XStack benchmark does (fresh re-run from the
port's own setup file, a frozen second stage, weights loaded back, rule-based integrity judges and an
optional LLM judge beside them). The library; ladder/_cli/grade.py is its command."""
