"""Jinja2 on the other side of the C++ Jinja subset (tokenizer/jinja/): small templates, each exercising one
construct chat templates use, rendered in transformers' own chat-template environment
(transformers.utils.chat_template_utils._compile_jinja_template: ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now, namespace, dict).

    python jinja_oracle.py OUT.jsonl
        Writes one object per case: {"template", "context", "expected"} or, where Jinja2 raises,
        {"template", "context", "error": <the exception's message>}. Exit 0.
"""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

CTX = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hi there!\n"},
        {"role": "assistant", "content": "Hello 👋 — ça va?", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
        {"role": "user", "content": "Thanks"},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather \"now\"",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}, "days": {"type": "integer"}},
                                                    "required": ["city"]}}}],
    "bos_token": "<s>", "eos_token": "</s>", "n": 7, "f": 2.5, "none_value": None, "empty": "", "flag": True,
    "nums": [3, 1, 2], "words": ["b", "A", "c"], "d": {"b": 1, "a": [1, 2.0, None, True]},
}

CASES = [
    # text, whitespace control, trim_blocks / lstrip_blocks, trailing newline
    "plain text\n",
    "a\n  {% if flag %}\n  yes\n  {% endif %}\nb\n",
    "a  {%- if flag -%}  x  {%- endif -%}  b",
    "a\n  {%+ if flag %}x{% endif +%}\nb",
    "{{ n }}  {% if flag %}x{% endif %}\n",
    "line1\n{# a comment #}\nline2\n    {# indented comment #}\nline3",
    "{% raw %}{{ not rendered }}{% endraw %}",
    "x\r\ny\rz\n\n",
    "{{ 'a' }}\n{{ 'b' }}\n",
    # expressions
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }}",
    "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ f * 2 }} {{ 3 / 3 }} {{ 123456789.0 * 1000 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' + 'cd' }} {{ 'x' * 3 }} {{ [1] + [2] }}",
    "{{ n > 3 and n < 10 }} {{ not flag }} {{ flag or n }} {{ empty or 'default' }} {{ 1 < 2 < 3 }} {{ 3 < 2 < 4 }}",
    "{{ 'b' in 'abc' }} {{ 'x' not in 'abc' }} {{ 2 in nums }} {{ 'a' in d }} {{ 'z' in d }}",
    "{{ 'yes' if flag else 'no' }} {{ 'yes' if not flag }}|",
    "{{ nums }} {{ d }} {{ none_value }} {{ flag }} {{ (1, 'a') }} {{ ('one',) }} {{ undefined_name }}|",
    "{{ \"it's\" }} {{ ['it\\'s', \"q\\\"q\", 'tab\\there'] }}",
    "{{ 'a' 'b' }} {{ \"\\u00e9\\n\" }}",
    # attributes, items, slices
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].content }} {{ messages|length }}",
    "{{ messages[1:] | length }} {{ nums[::-1] }} {{ 'hello'[1:3] }} {{ 'héllo'[::-1] }} {{ nums[5] }}|{{ d.missing }}|",
    "{{ d.a.1 }} {{ d['a'][0] }} {{ messages[2].tool_calls[0].function.name }}",
    "{{ d.items() | list }} {{ d.keys() | list }} {{ d.get('b') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }}",
    # string methods
    "[{{ '  x y  '.strip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '\\n\\nhi\\n'.lstrip('\\n') }}] [{{ ' a '.rstrip() }}]",
    "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a<think>b</think>c'.split('</think>')[0] }} {{ 'a b c'.split(' ', 1) }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} {{ 'ÉCOLE'.lower() }} {{ 'straße'.upper() }}",
    "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'hello'.capitalize() }} {{ ', '.join(words) }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('b') }}",
    # filters
    "{{ '  hi  ' | trim }} {{ 'hi' | upper }} {{ 'HI' | lower }} {{ nums | length }} {{ 'héllo' | length }} {{ d | count }}",
    "{{ tools | tojson }}",
    "{{ tools | tojson(indent=4) }}",
    "{{ d | tojson(separators=(',', ':'), sort_keys=true) }} {{ 'é\"\\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}",
    "{{ messages[2] | tojson }}",
    "{{ undefined_name | default('dflt') }} {{ empty | default('dflt') }} {{ empty | default('dflt', true) }} {{ none_value | d('x') }}",
    "{{ nums | join(', ') }} {{ words | sort | join }} {{ words | sort(case_sensitive=true) | join }} {{ nums | sort(reverse=true) }}",
    "{{ nums | first }} {{ nums | last }} {{ nums | reverse | list }} {{ 'abc' | reverse }} {{ nums | sum }} {{ nums | min }} {{ nums | max }}",
    "{{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }} {{ nums | select('odd') | list }} {{ nums | reject('even') | list }}",
    "{{ messages | selectattr('tool_calls', 'defined') | list | length }} {{ messages | selectattr('tool_calls') | list | length }}",
    "{{ d | items | list }} {{ d | dictsort }} {{ n | string }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x<y' | e }}|{{ 'one two  three' | wordcount }}",
    "{{ [1, 2, 1, 3] | unique | list }} {{ '%s-%d' | format('a', 3) }} {{ '%s and %s' % ('x', 'y') }} {{ 'v=%s' % n }}",
    # tests
    "{{ n is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none_value is none }} {{ 'x' is string }} {{ n is number }} {{ n is integer }} {{ f is float }}",
    "{{ d is mapping }} {{ nums is sequence }} {{ nums is iterable }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ flag is true }} {{ flag is boolean }}",
    "{{ 'a' is in 'abc' }} {{ 2 is in nums }} {{ n is eq 7 }} {{ n is ne 7 }} {{ n is gt 3 }} {{ 'abc' is lower }} {{ n is not none }} {{ raise_exception is callable }}",
    # loops
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if not loop.last %}, {% endif %}{% endfor %}",
    "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}{{ m.content | trim }}{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %} {% for c in 'héllo' %}[{{ c }}]{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for m in messages %}{% if loop.previtem is defined %}{{ loop.previtem.role }}>{% endif %}{{ m.role }} {% endfor %}",
    "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for message in messages[::-1] %}{{ message.role[0] }}{% endfor %}",
    # scoping, set, namespace
    "{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}",
    "{% set ns = namespace(total=0, found=false) %}{% for i in nums %}{% set ns.total = ns.total + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}",
    "{% if flag %}{% set y = 'set in if' %}{% endif %}{{ y }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set block %}captured {{ n }}{% endset %}[{{ block }}]",
    "{% set dd = dict(a=1, b='x') %}{{ dd.a }}{{ dd['b'] }} {{ dict(d, c=3) | tojson }}",
    "{% set system_message = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}{{ system_message }}",
    # macros
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Cy') }}",
    "{%- macro render(value) -%}{%- if value is string -%}{{ value }}{%- elif value is mapping -%}{{ value | tojson }}{%- else -%}{{ value }}{%- endif -%}{%- endmacro -%}{{ render('s') }} {{ render(d) }} {{ render(3) }}",
    # errors
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}",
    "{% if messages[1]['role'] != 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    "{{ undefined_name.attribute }}",
    "{{ 1 + 'a' }}",
    "{{ d.missing.deeper }}",
    # strftime_now exists (its value depends on the clock, so only its type is checked here)
    "{{ strftime_now('%Y') | length }}",
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        for template in CASES:
            row = {"template": template, "context": CTX}
            try:
                row["expected"] = _compile_jinja_template(template).render(**CTX)
            except Exception as e:  # the message the C++ side must give (raise_exception's) or at least an error
                row["error"] = str(e)
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases to {sys.argv[1]}")


if __name__ == "__main__":
    main()
