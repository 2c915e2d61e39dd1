#!/usr/bin/env python3
"""Generates the byte-level BPE tokenizer fixtures in tests/data/tokenizers/.

Runs where the Hugging Face `tokenizers` library is installed (the project's
GPU machine has tokenizers 0.23 and transformers 5.17); nothing is downloaded.

It trains three small byte-level BPE tokenizers and writes, for each, the
tokenizer.json and the ids/tokens/decodes that `tokenizers` produces for a
fixed list of test strings:

  deepseek_v3_style  DeepSeek-V3's pre-tokenizer (its three Split regexes, copied
                     as data from the published tokenizer.json) + ByteLevel, its
                     special tokens (ids 0..2 like the real file, the rest after
                     the vocabulary), `<｜User｜>` / `<｜Assistant｜>` / `<think>`
                     as non-special normalized added tokens, a TemplateProcessing
                     post-processor that prepends BOS, merges stored as "a b".
  glm_style          GLM-4.7's pre-tokenizer (one Split regex) + ByteLevel, no
                     normalizer, ignore_merges, a ByteLevel post-processor (adds
                     nothing), GLM's special tokens after the vocabulary and
                     `<think>` etc. as non-special, merges stored as ["a", "b"].
  misc_style         GPT-2 style: Digits(individual) + ByteLevel(add_prefix_space,
                     use_regex), added tokens with lstrip / rstrip / single_word /
                     normalized, Sequence[ByteLevel, TemplateProcessing "<s> $A
                     </s>"] post-processor, decoder Sequence[ByteLevel].

It also records pre-tokenizer outputs (Split behaviours, invert, Digits,
ByteLevel options, and the DeepSeek/GLM split sequences on every test string) in
pretokenize_cases.json, so the C++ pre-tokenizer can be checked piece by piece.

Training text: the top-level *.py modules of the running Python's standard
library (Python Software Foundation License), read in sorted order up to a size
limit, plus a short multilingual paragraph written for this project. The file
list and its sha256 are recorded in expected.json.

Usage:
  python3 tools/make_tokenizer_fixtures.py --out tests/data/tokenizers
"""

import argparse
import hashlib
import json
import pathlib
import platform
import sys
import sysconfig
import time
import traceback

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

# ---------------------------------------------------------------------------
# Pre-tokenizer regexes (data copied from the published tokenizer.json files).

# DeepSeek-V3: three Split(Isolated) patterns. The third contains literal CR and
# LF characters inside its classes, exactly as the published file does.
DS_SPLIT_PATTERNS = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

# GLM-4.5 / 4.7 / 5: one Split(Isolated) pattern.
GLM_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

DS_BOS = "<｜begin▁of▁sentence｜>"
DS_EOS = "<｜end▁of▁sentence｜>"
DS_PAD = "<｜▁pad▁｜>"
DS_MORE_SPECIALS = [
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜place▁holder▁no▁0｜>",
]
DS_NON_SPECIAL = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]

GLM_SPECIALS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>",
]
GLM_NON_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>", "/nothink"]

# Written for this project (freely usable); gives the trainer some non-Latin
# merges so multi-byte characters are merged in the fixtures.
MULTILINGUAL = """\
数字と漢字のテスト、そして日本語の文章です。東京は日本の首都です。
你好，世界！今天天气很好。我们一起学习中文分词和机器学习。
한국어 문장도 있어요. 서울은 한국의 수도입니다.
مرحبا بالعالم، هذا اختبار بسيط للنص العربي.
Привет, мир! Это простой тест для русского текста.
Γειά σου κόσμε! Αυτό είναι ένα απλό κείμενο.
नमस्ते दुनिया, यह एक सरल परीक्षण है।
Café naïve résumé — “quotes” ‘single’ … façade über straße.
Emoji 🙂🌊🦓 👍🏽 👨‍👩‍👧‍👦 ❤️ 🇯🇵 and symbols €£¥ © ® ™ ∑ ∫ √.
"""

# ---------------------------------------------------------------------------
# Test strings, shared by every fixture.

COMMON_STRINGS = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "It's what we'll use; they've said I'd go. DON'T SHOUT, JOHN'S BOOK'S",
    "it\u017f long s after apostrophe: it'\u017f",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo:\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 42) -> None:\n"
    "        self.x = x  # comment\n",
    "\tindented\twith\ttabs\n\t\tnested\n",
    "if (a && b) { return x->y[0]; } // C++\n#include <vector>\n",
    "数字と漢字のテスト、そして한국어 문장도 있어요. 中文分词测试。",
    "你好，世界！今天天气很好。",
    "カタカナとひらがな、ｶﾀｶﾅ半角",
    "Emoji 🙂🌊🦓 and symbols €£¥ © ® ™ ∑ ∫ √",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag",
    "👍🏽👋🏿 skin tones and 🇯🇵🇫🇷 flags",
    "❤️ red heart with VS16 and ☺︎ text style",
    "مرحبا بالعالم، هذا اختبار. ١٢٣٤٥",
    "שלום עולם",
    "Привет, мир! Ёлка.",
    "Γειά σου κόσμε",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Café naïve résumé — “quotes” ‘single’ … façade",
    "e\u0301 (decomposed) vs \u00e9 (composed)",
    "   ",
    "a    b",
    "\n\n\n",
    "line1\r\nline2\r\n",
    "ends with newline\n",
    "\n",
    " \n \n ",
    "word \n\n  next",
    "\u00a0non-breaking\u00a0space",
    "\u3000ideographic\u3000space",
    "line\u2028separator and para\u2029separator",
    "next\u0085line and mongolian\u180evowel",
    "zero\u200bwidth and \ufeffBOM",
    "1234567",
    "3.14159 2,718 1e-10 0x1F 007",
    "٣٤٥ and ۷۸۹ other digits",
    "①②③ circled, ½ ¾ fractions, ²³ superscripts",
    "The year 2024 had 366 days; 1,000,000 people.",
    "!!!???...---___***",
    "a--b==c!=d<=e>=f",
    "https://example.com/path?q=1&r=2#frag",
    "user@example.org (mail)",
    "\x00\x01\x07\x1b[0m\x7f controls",
    "supercalifragilisticexpialidocious " * 3,
    "a" * 64,
    "________________________________",
    "The quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n\nfor path in sys.argv[1:]:\n    print(os.path.basename(path))\n",
    # Tokens that are special in one fixture are plain text in the others.
    f"{DS_BOS}Hello{DS_NON_SPECIAL[0]}What is 2+2?{DS_NON_SPECIAL[1]}4{DS_EOS}",
    f"text{DS_EOS}more text",
    f"{DS_NON_SPECIAL[0]}{DS_NON_SPECIAL[0]}adjacent",
    "<｜User incomplete special <｜Use",
    "<think>reasoning here</think>answer",
    "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi<|assistant|>\n",
    "<|user|>Hello<|assistant|></think>Hi there<|endoftext|>",
    "[gMASK][gMASK]<sop>",
    "<s>bos and </s> eos and <mask> mask",
]

MISC_EXTRA = [
    "Hello <mask> world",
    "Hello<mask>world",
    "Hello   <mask>   world",
    "[R]   spaces after rstrip token",
    "x[R]y",
    "a word b",
    "awordb",
    "sword word. word",
    "word",
    "left <|both|>   right",
    "abcd abc ab a",
    "the <<a>> and <a> tokens",
    "123 4567 89",
]


# Chat templates (data, reproduced from the published files) rendered with
# transformers' apply_chat_template to check model/chat_format.cc.
# DeepSeek-V3 tokenizer_config.json "chat_template".
DS_V3_TEMPLATE = (
    r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"""
    r"""{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}"""
    r"""{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"""
    r"""{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}"""
    r"""{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}"""
    r"""{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"""
    r"""{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"""
    r"""{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"""
    r"""{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"""
    r"""{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"""
    r"""{%- set ns.is_first = true -%}{%- else %}"""
    r"""{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"""
    r"""{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"""
    r"""{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}"""
    r"""{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"""
    r"""{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"""
    r"""{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"""
    r"""{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"""
    r"""{%- set ns.is_output_first = false %}{%- else %}"""
    r"""{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"""
    r"""{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"""
    r"""{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"""
)

# GLM-4.7 chat_template.jinja (GLM-4.7-Flash; GLM-5 uses the same turn format).
GLM47_TEMPLATE = r"""[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content -%}
{{ '<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '</think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{- '<tool_call>' + tc.name -}}
{% set _args = tc.arguments %}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '<tool_response>' }}
{{- m.content }}
{{- '</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}
<tool_response>{{ tr.output if tr.output is defined else tr }}</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}
{%- endif -%}"""


def _m(role, content, reasoning=None):
    d = {"role": role, "content": content}
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    return d


_CONVERSATION = [_m("system", "You are a helpful assistant."), _m("user", "Hello"),
                 _m("assistant", "Hi there!"), _m("user", "How are you?")]
_THINK_ANSWER = _m("assistant", "<think>\nreason\n</think>\n\n answer ")
# (template, messages, add_generation_prompt, thinking)
CHAT_CASES = [
    ("deepseek_v3", _CONVERSATION, True, False),
    ("deepseek_v3", [_m("user", "Hi")], False, False),
    ("deepseek_v3", [_m("system", "A"), _m("user", "u"), _m("system", "B")], True, False),
    ("deepseek_v3", [_m("user", "q"), _m("assistant", "a"), _m("user", "q2"),
                     _m("assistant", "a2")], False, False),
    ("deepseek_v3", [_m("user", "  spaced\n"), _m("assistant", "\n<think>x</think> y ")],
     True, False),
    ("glm47", _CONVERSATION, True, False),
    ("glm47", _CONVERSATION, True, True),
    ("glm47", _CONVERSATION, False, False),
    ("glm47", [_m("user", "q"), _THINK_ANSWER], False, False),
    ("glm47", [_m("user", "q"), _THINK_ANSWER, _m("user", "more")], True, False),
    ("glm47", [_m("user", "q"), _m("assistant", " a ", " why ")], False, False),
    ("glm47", [_m("user", "q"), _m("assistant", "  Hi  \n")], False, False),
    ("glm47", [_m("system", "S"), _m("system", "S2"), _m("user", "u")], True, True),
    ("glm47", [_m("user", "q"), _m("assistant", "<think>old</think>a", "kept"), _m("user", "r"),
               _m("assistant", "\u3000final\u3000", "\n why \n")], False, False),
    ("glm47", [_m("user", " x "), _m("assistant", "")], True, False),
]


def random_strings(count, seed, specials):
    """Seeded random strings mixing scripts, spaces, digits, emoji, specials."""
    import random
    rng = random.Random(seed)

    def span(lo, hi):
        return lambda: chr(rng.randint(lo, hi))

    pools = [
        (30, lambda: rng.choice(["the", " the", "and", " of", "def", " return", "self", "ing",
                                 "tion", " a", "I", "x", "_", "0", "123", "4567", "foo", "Bar"])),
        (10, lambda: rng.choice([" ", "  ", "\t", "\n", "\r\n", "\n\n", "    ", " \n"])),
        (8, lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")),
        (4, lambda: rng.choice(["'s", "'T", "'LL", "'re", "'d", "'M", "'ve"])),
        (4, span(0x00C0, 0x024F)),   # Latin extended
        (3, span(0x0300, 0x036F)),   # combining marks
        (5, span(0x4E00, 0x9FA5)),   # CJK
        (3, span(0x3040, 0x30FF)),   # kana
        (3, span(0xAC00, 0xD7A3)),   # Hangul
        (2, span(0x0600, 0x06FF)),   # Arabic
        (2, span(0x0900, 0x097F)),   # Devanagari
        (2, span(0x0E00, 0x0E7F)),   # Thai
        (2, span(0x0400, 0x04FF)),   # Cyrillic
        (4, span(0x1F300, 0x1FAFF)),  # emoji
        (2, lambda: rng.choice(["\u200d", "\ufe0f", "\U0001F3FB", "\U0001F3FF", "\u20e3"])),
        (3, lambda: rng.choice(["\u00a0", "\u2002", "\u2009", "\u3000", "\u0085", "\u180e",
                                "\u2028", "\u200b", "\u000b", "\u000c", "\u001f"])),
        (3, lambda: rng.choice(["\u0663", "\u06f5", "\uff11", "\u00b2", "\u2167", "\u2460",
                                "\u00bd", "\U0001D7D9", "\u0f33"])),
        (2, span(0x2000, 0x2BFF)),   # punctuation, arrows, symbols
        (2, span(0x10000, 0x1D7FF)),  # supplementary letters and symbols
        (2, span(0xE000, 0xE0FF)),   # private use
        (1, span(0x0001, 0x001F)),   # controls
        (2, lambda: rng.choice(specials)),
    ]
    weights = [w for w, _ in pools]
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        out.append("".join(rng.choices(pools, weights)[0][1]() for _ in range(n)))
    return out


def held_out_text(used_files, limit_chars=4000):
    """Source text from standard-library modules that were not trained on."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        if path.name in used_files:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > limit_chars:
            return [text[:limit_chars], text[limit_chars:2 * limit_chars]]
    return []


def chat_cases(ds_path):
    """Renders CHAT_CASES with transformers' apply_chat_template."""
    out = {"cases": []}
    try:
        import transformers
        out["transformers_version"] = transformers.__version__
        cls = getattr(transformers, "PreTrainedTokenizerFast", None) or getattr(
            transformers, "TokenizersBackend")
        hf = cls(tokenizer_file=str(ds_path), bos_token=DS_BOS, eos_token=DS_EOS)
        for template, messages, gen, thinking in CHAT_CASES:
            kwargs = {} if thinking or template == "deepseek_v3" else {"enable_thinking": False}
            text = DS_V3_TEMPLATE if template == "deepseek_v3" else GLM47_TEMPLATE
            entry = {"template": template, "messages": messages,
                     "add_generation_prompt": gen, "thinking": thinking}
            try:
                entry["rendered"] = hf.apply_chat_template(
                    messages, chat_template=text, tokenize=False, add_generation_prompt=gen,
                    **kwargs)
            except Exception:
                entry["error"] = traceback.format_exc(limit=3)
            out["cases"].append(entry)
    except Exception:
        out["error"] = traceback.format_exc(limit=3)
    return out


def bytes_to_unicode():
    """GPT-2's byte to printable-character table (as the ByteLevel step uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def corpus(limit_bytes):
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    used, texts, total = [], [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        used.append(path.name)
        total += len(text.encode("utf-8"))
        if total >= limit_bytes:
            break
    texts.append(MULTILINGUAL * 20)
    joined = "".join(texts)
    meta = {
        "source": "top-level *.py modules of the Python standard library "
                  f"(Python {platform.python_version()}, Python Software Foundation License), "
                  "sorted by name, plus a multilingual paragraph written for this project",
        "files": used,
        "bytes": len(joined.encode("utf-8")),
        "sha256": hashlib.sha256(joined.encode("utf-8")).hexdigest(),
    }
    return joined.splitlines(keepends=True), meta


def train(pre_tokenizer, vocab_size, initial_specials, lines, bpe_kwargs=None):
    tok = Tokenizer(models.BPE(**(bpe_kwargs or {})))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=initial_specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def finish(tok, edit):
    """Applies JSON edits (merges form, model flags) and reloads the tokenizer."""
    data = json.loads(tok.to_str())
    edit(data)
    text = json.dumps(data, ensure_ascii=False, indent=1)
    return Tokenizer.from_str(text), text


def encode_cases(tok, strings):
    cases = []
    for s in strings:
        with_sp = tok.encode(s, add_special_tokens=True)
        without = tok.encode(s, add_special_tokens=False)
        cases.append({
            "text": s,
            "ids": with_sp.ids,
            "tokens": with_sp.tokens,
            "ids_no_special": without.ids,
            "decode_keep_special": tok.decode(with_sp.ids, skip_special_tokens=False),
            "decode_skip_special": tok.decode(with_sp.ids, skip_special_tokens=True),
        })
    return cases


def decode_cases(tok, specials):
    """Id sequences whose bytes are not valid UTF-8, and other decode edge cases."""
    vocab = tok.get_vocab()
    b2u = bytes_to_unicode()

    def b(*bs):
        return [vocab[b2u[x]] for x in bs]

    def t(s):
        return tok.encode(s, add_special_tokens=False).ids

    sp = [vocab[s] for s in specials]
    seqs = [
        b(0xE4, 0xBD) + t("A"),
        b(0x80),
        t("x") + b(0xF0, 0x9F, 0x99),
        b(0xC0, 0xAF),
        b(0xED, 0xA0, 0x80),
        b(0xF4, 0x90, 0x80, 0x80),
        b(0xE4) + b(0xBD) + b(0xA0),
        b(0xFF, 0xFE),
        t("a") + b(0xF0, 0x9F) + t("b"),
        b(0xE2, 0x82) + b(0xAC),
        b(0xF0, 0x9F, 0x98) + b(0x80, 0xF0, 0x9F),
        sp[:1] + b(0xE4) + sp[1:2] + b(0xBD, 0xA0) + sp[:1],
        t("ok") + [10 ** 7] + t("!"),
        [],
    ]
    out = []
    for ids in seqs:
        for skip in (False, True):
            entry = {"ids": ids, "skip_special_tokens": skip}
            try:
                entry["text"] = tok.decode(ids, skip_special_tokens=skip)
            except Exception as e:  # recorded, not fatal
                entry["error"] = repr(e)
            out.append(entry)
    return out


def ignore_merges_words(tok_json_text, lines, limit=8):
    """Words whose ids differ between ignore_merges true and false."""
    data = json.loads(tok_json_text)
    data["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    ign = Tokenizer.from_str(tok_json_text)
    u2b = {c: b for b, c in bytes_to_unicode().items()}
    found, seen = [], set()
    for line in lines[:40000]:
        for piece, _ in ign.pre_tokenizer.pre_tokenize_str(line):
            if piece in seen:
                continue
            seen.add(piece)
            a = [x.id for x in ign.model.tokenize(piece)]
            c = [x.id for x in plain.model.tokenize(piece)]
            if a != c:
                word = bytes(u2b[ch] for ch in piece).decode("utf-8", errors="replace")
                found.append(word)
                if len(found) >= limit:
                    return found
    return found


def transformers_check(path, cases):
    """Compares transformers' tokenizer(text) and decode with the tokenizers ids."""
    result = {}
    try:
        import transformers
        result["version"] = transformers.__version__
        cls = getattr(transformers, "PreTrainedTokenizerFast", None) or getattr(
            transformers, "TokenizersBackend")
        hf = cls(tokenizer_file=str(path))
        diffs = []
        for c in cases:
            a = list(hf(c["text"])["input_ids"])
            n = list(hf(c["text"], add_special_tokens=False)["input_ids"])
            d = hf.decode(c["ids"], skip_special_tokens=False)
            if a != c["ids"] or n != c["ids_no_special"] or d != c["decode_keep_special"]:
                diffs.append({"text": c["text"], "ids": a, "ids_no_special": n, "decode": d})
        result["cases"] = len(cases)
        result["differences"] = diffs
    except Exception:
        result["error"] = traceback.format_exc(limit=3)
    return result


def pretokenize_cases(all_strings):
    def pt_json(p):
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = p
        return json.loads(t.to_str())["pre_tokenizer"]

    def run(p, inputs):
        return {"pre_tokenizer": pt_json(p),
                "cases": [{"text": s, "pieces": [x for x, _ in p.pre_tokenize_str(s)]}
                          for s in inputs]}

    small = ["Hello  world  foo", "  lead and trail  ", "a1b22c333", "", "x", "12345 678",
             "\u0663\u0664\u0665 \u00bd \u2460x", "one\ttwo\nthree", "--a--b----c--"]
    groups = []
    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"]:
        for invert in (False, True):
            groups.append(run(pre_tokenizers.Split(Regex(r"\s+"), behavior, invert), small))
            groups.append(run(pre_tokenizers.Split("--", behavior, invert), small))
        groups.append(run(pre_tokenizers.Split(Regex(r"\d"), behavior), small))
    for individual in (True, False):
        groups.append(run(pre_tokenizers.Digits(individual_digits=individual), small))
    for aps in (True, False):
        for ur in (True, False):
            groups.append(run(pre_tokenizers.ByteLevel(add_prefix_space=aps, use_regex=ur),
                              small + all_strings))
    ds = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), "isolated")
                                  for p in DS_SPLIT_PATTERNS])
    groups.append(run(ds, all_strings))
    groups.append(run(pre_tokenizers.Split(Regex(GLM_SPLIT_PATTERN), "isolated"), all_strings))
    return groups


def dumps_readable(obj, indent=0):
    """JSON with one line per list element of dicts; everything else compact."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {dumps_readable(v, indent + 1).lstrip()}'
                 for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else pad + "{}"
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        items = [dumps_readable(x, indent + 1) for x in obj]
        return pad + "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(obj, dict) or (isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj)):
        return pad + json.dumps(obj, ensure_ascii=True)
    return pad + json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/tokenizers")
    ap.add_argument("--corpus-bytes", type=int, default=3_000_000)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"python {sys.version.split()[0]}, tokenizers {tokenizers.__version__}")

    lines, corpus_meta = corpus(args.corpus_bytes)
    log(f"corpus: {len(corpus_meta['files'])} files, {corpus_meta['bytes']} bytes")

    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fixtures = {}

    # --- DeepSeek-V3 style -------------------------------------------------
    log("training deepseek_v3_style")
    ds_pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), "isolated") for p in DS_SPLIT_PATTERNS] + [bl])
    ds = train(ds_pre, 3000, [DS_BOS, DS_EOS, DS_PAD], lines)
    ds.normalizer = normalizers.Sequence([])
    ds.decoder = decoders.ByteLevel()
    ds.add_special_tokens([AddedToken(s, special=True, normalized=False)
                           for s in DS_MORE_SPECIALS])
    ds.add_tokens([AddedToken(s, special=False, normalized=True) for s in DS_NON_SPECIAL])
    bos_id = ds.token_to_id(DS_BOS)
    ds.post_processor = processors.TemplateProcessing(
        single=[DS_BOS, "$A"], pair=[DS_BOS, "$A", DS_BOS, "$B:1"],
        special_tokens=[(DS_BOS, bos_id)])

    def ds_edit(d):
        d["model"]["merges"] = [m if isinstance(m, str) else f"{m[0]} {m[1]}"
                                for m in d["model"]["merges"]]

    held_out = held_out_text(set(corpus_meta["files"]))
    ds_random = random_strings(150, 1, [DS_BOS, DS_EOS] + DS_NON_SPECIAL + DS_MORE_SPECIALS[:2])
    fixtures["deepseek_v3_style"] = (ds, ds_edit, "string", [DS_BOS, DS_EOS],
                                     COMMON_STRINGS + held_out + ds_random)

    # --- GLM style -------------------------------------------------------
    log("training glm_style")
    glm_pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(GLM_SPLIT_PATTERN), "isolated"), bl])
    glm = train(glm_pre, 4000, [], lines, {"ignore_merges": True})
    glm.decoder = decoders.ByteLevel()
    glm.post_processor = processors.ByteLevel(trim_offsets=False)
    glm.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in GLM_SPECIALS])
    glm.add_tokens([AddedToken(s, special=False, normalized=False) for s in GLM_NON_SPECIAL])

    def glm_edit(d):
        d["normalizer"] = None
        d["model"]["ignore_merges"] = True
        d["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                                for m in d["model"]["merges"]]

    glm_random = random_strings(150, 2, GLM_SPECIALS[:9] + GLM_NON_SPECIAL)
    fixtures["glm_style"] = (glm, glm_edit, "pair", ["[gMASK]", "<|user|>"],
                             COMMON_STRINGS + held_out + glm_random)

    # --- misc (GPT-2 style, added-token options) ---------------------------
    log("training misc_style")
    misc_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    misc = train(misc_pre, 1500, ["<s>", "</s>"], lines)
    misc.decoder = decoders.Sequence([decoders.ByteLevel()])
    misc.add_special_tokens([
        AddedToken("<mask>", special=True, lstrip=True, normalized=False),
        AddedToken("[R]", special=True, rstrip=True, normalized=False),
        AddedToken("<<a>>", special=True, normalized=False),
    ])
    misc.add_tokens([
        AddedToken("word", special=False, single_word=True, normalized=False),
        AddedToken("<|both|>", special=False, lstrip=True, rstrip=True, normalized=True),
        AddedToken("abc", special=False, normalized=True),
        AddedToken("ab", special=False, normalized=True),
        AddedToken("<a>", special=False, normalized=True),
    ])
    misc.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=["<s>", "$A", "</s>"], pair=["<s>", "$A", "</s>", "$B:1", "</s>:1"],
            special_tokens=[("<s>", misc.token_to_id("<s>")),
                            ("</s>", misc.token_to_id("</s>"))]),
    ])

    def misc_edit(d):
        d["normalizer"] = None
        d["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                                for m in d["model"]["merges"]]

    misc_random = random_strings(100, 3, ["<mask>", "[R]", "<<a>>", "word", "<|both|>", "ab",
                                          "abc", "<a>", " word ", "  <mask>  "])
    fixtures["misc_style"] = (misc, misc_edit, "pair", ["<s>", "<mask>"],
                              COMMON_STRINGS + MISC_EXTRA + misc_random)

    expected = {
        "generator": "tools/make_tokenizer_fixtures.py",
        "python": platform.python_version(),
        "tokenizers_version": tokenizers.__version__,
        "corpus": corpus_meta,
        "fixtures": {},
    }
    for name, (tok, edit, form, specials, strings) in fixtures.items():
        log(f"writing {name}")
        final, text = finish(tok, edit)
        path = out / f"{name}.tokenizer.json"
        path.write_text(text, encoding="utf-8")
        check = json.loads(final.to_str())
        entry = {
            "file": path.name,
            "merges_form": form,
            "vocab_size": final.get_vocab_size(),
            "ignore_merges": check["model"].get("ignore_merges"),
            "cases": encode_cases(final, strings),
        }
        try:
            entry["decode_cases"] = decode_cases(final, specials)
        except Exception:
            entry["decode_cases_error"] = traceback.format_exc(limit=3)
        if name == "glm_style":
            try:
                words = ignore_merges_words(text, lines)
                entry["ignore_merges_words"] = words
                entry["cases"] += encode_cases(final, words)
            except Exception:
                entry["ignore_merges_error"] = traceback.format_exc(limit=3)
        entry["transformers"] = transformers_check(path, entry["cases"])
        expected["fixtures"][name] = entry
        log(f"  {name}: vocab {entry['vocab_size']}, {len(entry['cases'])} cases, "
            f"transformers: {entry['transformers'].get('error') or len(entry['transformers'].get('differences', []))}")

    (out / "expected.json").write_text(dumps_readable(expected) + "\n", encoding="utf-8")
    log("writing pretokenize_cases.json")
    try:
        groups = pretokenize_cases(COMMON_STRINGS + MISC_EXTRA + ds_random + glm_random)
        (out / "pretokenize_cases.json").write_text(
            dumps_readable({"tokenizers_version": tokenizers.__version__, "groups": groups})
            + "\n", encoding="utf-8")
    except Exception:
        traceback.print_exc()
    log("rendering chat templates")
    chats = chat_cases(out / "deepseek_v3_style.tokenizer.json")
    (out / "chat_cases.json").write_text(dumps_readable(chats) + "\n", encoding="utf-8")
    log(f"  {len(chats['cases'])} chat cases, error: {chats.get('error')}")
    for p in sorted(out.iterdir()):
        log(f"  {p.name}: {p.stat().st_size} bytes")
    log("done")


if __name__ == "__main__":
    main()
