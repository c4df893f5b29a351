"""The structured output tests' validator: the `jsonschema` package (Draft 2020-12) and Python's json parser.

    python tests/oracle/jsonschema_oracle.py CASES.jsonl

Each line: {"schema": S | null (any JSON object), "text": T}. Every T must parse as JSON (strictly: no NaN) and
validate against S. Prints one line per failure and a `summary` line; exit 1 on any failure.
"""
import json
import sys

import jsonschema


def strict_loads(text):
    def refuse(c):
        raise ValueError(f"non-JSON constant {c}")
    return json.loads(text, parse_constant=refuse)


def main():
    cases = failures = 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            case = json.loads(line)
            cases += 1
            try:
                value = strict_loads(case["text"])
                if case["schema"] is None:
                    if not isinstance(value, dict):
                        raise ValueError("not a JSON object")
                else:
                    jsonschema.Draft202012Validator(case["schema"]).validate(value)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failures += 1
                print(f"FAIL {case.get('label', '')}: {case['text']!r}: {str(e)[:300]}")
    print(f"summary cases={cases} failures={failures}")
    return 1 if failures or cases == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
