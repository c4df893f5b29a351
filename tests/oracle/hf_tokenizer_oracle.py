"""Hugging Face tokenizers/transformers (and SentencePiece) on the other side of the C++ tests of our tokenizer reader.

    python hf_tokenizer_oracle.py make ROOT [--kinds gpt2,llama3,qwen2,llama2,gemma,spm]
        For each KIND (default: all; spm differs, see below), trains a small BPE tokenizer with the `tokenizers`
        package on local text (the files in /usr/share/common-licenses plus SAMPLE below), gives it the pipeline
        that the real checkpoints of that family use (normalizer, pre-tokenizer, model options, decoder,
        post-processor, special tokens where the real files have them, see KINDS), adds one non-special added
        token ADDED_TOKEN, and saves it with transformers' PreTrainedTokenizerFast(...).save_pretrained(ROOT/KIND):
        tokenizer.json and tokenizer_config.json (tokenizer_class "TokenizersBackend", so transformers 5 loads
        tokenizer.json as it is; "GemmaTokenizer", say, would rebuild the pipeline), plus special_tokens_map.json in
        the layout of the real checkpoints (transformers 5 no longer writes that file). Then loads ROOT/KIND back
        with transformers.AutoTokenizer and writes
          ROOT/KIND/expected.jsonl    one object per test text: {"text", "ids": tok(text)["input_ids"] (special
                                      tokens added as the family does), "decoded": tok.decode(ids),
                                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
          ROOT/KIND/expected_meta.json  {"bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                                      "vocab_size": len(tok), "added_token_id", "num_texts"}
        Test texts: every line of SAMPLE (empty and whitespace-only ones included), the first 300 non-empty lines of
        GPL-3, a few multi-line texts (newline handling, the whole SAMPLE as one text) and lines that hold the
        kind's special tokens and ADDED_TOKEN literally.
        Checks, per kind, that the tokenizer loaded by transformers is the saved tokenizer.json and encodes every
        test text exactly as tokenizers.Tokenizer.from_file(tokenizer.json).encode(text) does, and decodes as its
        decode does; for llama2 and gemma, that some ids are byte-fallback tokens <0x..> (BYTE_FIRST); for llama3,
        that ignore_merges=False would change some ids. Vocabulary: 1500 trained tokens for the byte-level kinds
        (llama3: plus IGNORE_MERGES_WORD; gpt2: plus <|endoftext|> in the model vocabulary as GPT-2 has it), then the
        specials, then ADDED_TOKEN; for llama2 1200 trained (specials <unk> <s> </s> at 0..2 included) plus the 256
        byte tokens, inserted at ids 3..258 as in Llama 2, then ADDED_TOKEN; for gemma 1200 trained (specials <pad>
        <eos> <bos> <unk> <mask> <start_of_turn> <end_of_turn> at 0..6 included, all special added tokens) plus the
        256 byte tokens <0x00>..<0xFF> at ids 7..262, then ADDED_TOKEN (1456).
        gemma is the pipeline of Gemma 1/2/3's tokenizer.json, as transformers' GemmaConverter wrote it: normalizer
        Replace " " -> "▁" (no dummy prefix), no pre-tokenizer (transformers 5's GemmaTokenizer would add a
        Split " " MergedWithPrevious, a no-op after that normalizer), BPE with byte_fallback and fuse_unk,
        unk <unk>, post-processor TemplateProcessing "<bos> $A" (pair "<bos> $A <bos> $B"), decoder Sequence
        [Replace "▁" -> " ", ByteFallback, Fuse] (no Strip: decode keeps a leading space).
        spm is no tokenizer.json but a SentencePiece-only checkpoint as the old Llama 2 / Mistral repositories ship:
          ROOT/spm/tokenizer.model   trained with the `sentencepiece` package on the corpus lines with Llama 2's
                                      trainer_spec and normalizer_spec (SPM_TRAINER: BPE, byte_fallback,
                                      split_digits, <unk> <s> </s> = 0 1 2, no pad, the 256 byte pieces at 3..258,
                                      identity normalization, add_dummy_prefix, remove_extra_whitespaces false),
                                      vocab_size 1456; nothing in it that libsentencepiece 0.1.97 cannot read
          ROOT/spm/tokenizer_config.json  Llama-2-7b-hf's (tokenizer_class "LlamaTokenizer", add_bos_token true,
                                      add_eos_token false, legacy false, pad_token null); special_tokens_map.json
          ROOT/spm/expected.jsonl    {"text", "ids": [bos] + sp.encode(text) (add_bos_token; "<s>" etc. in the
                                      text are plain text to SentencePiece), "decoded" and "decoded_skip" both
                                      sp.decode(ids) (SentencePiece decodes <s> </s> to nothing and drops the dummy
                                      prefix space; transformers' decode with special tokens kept gives
                                      "<s> " + that instead, so it is not used), "hf_ids": what
                                      transformers.AutoTokenizer (which converts tokenizer.model to a tokenizers
                                      pipeline) gives, for comparison only}
          ROOT/spm/expected_meta.json  as above from sentencepiece: vocab_size sp.get_piece_size(), pad_token_id
                                      null, added_token_id null (a .model has no added tokens; the ADDED_TOKEN
                                      texts are ordinary text here)
        spm checks that transformers' special ids and len(tok) are sentencepiece's and that some ids are byte
        pieces, and prints (without failing) on how many texts hf_ids differ from ids, in classes: texts that hold
        <unk> <s> </s> literally (transformers matches them as special tokens), texts that start with a space
        (transformers' Metaspace adds no dummy "▁" when the text starts with one: hf_ids = [bos] +
        sp.encode(text[1:])), others; and how often transformers' decode(skip_special_tokens=True) differs from
        "decoded". Deterministic; about 3 s on one core for all kinds.
    python hf_tokenizer_oracle.py list
        Prints the kinds.
    python hf_tokenizer_oracle.py bench ROOT KIND [--repeat N]
        Encodes the test texts plus every line of the corpus N times with the raw tokenizers.Tokenizer of
        ROOT/KIND/tokenizer.json (spm: the sentencepiece.SentencePieceProcessor of tokenizer.model, <s> added) on
        one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false; spm: num_threads=1), special tokens added,
        once with encode_batch (spm: encode of the list) and once line by line with encode, and prints one line per
        way:
          hf_tokens_per_s=<float> tokens=<int> seconds=<float> mode=encode_batch|encode texts=<int> bytes=<int>
        (the BPE word cache is warm after the first repeat, as it would be in a long run).
Exit status 0 when everything worked and matched; 1 otherwise.
"""
import argparse
import collections
import json
import os
import sys
import time

LICENSES = "/usr/share/common-licenses"
GPL3 = os.path.join(LICENSES, "GPL-3")
GPL3_LINES = 300
ADDED_TOKEN = "<added_tok>"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Multilingual, emoji and whitespace-heavy text. A list joined with "\n" so that trailing spaces, tabs and the
# whitespace-only / empty lines survive editors. Each line is a test text; SAMPLE is also training text.
SAMPLE = "\n".join([
    "Hello, world! This is a small test of the tokenizer.",
    "The quick brown fox jumps over the lazy dog; don't panic, I'LL be fine, we've got this.",
    "It's John's book. They're here, you'd know, she'll go, I'm sure. IT'S LOUD, THEY'RE LOUDER, WE'VE WON.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. Äpfel, Öl, Übermut, Straße.",
    "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë au delà des îles, à l'été.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "我能吞下玻璃而不伤身体。你好，世界！机器学习和深度学习。",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナ、ひらがな、漢字。こんにちは世界",
    "키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다. 안녕하세요, 세계!",
    "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت — مرحبا بالعالم",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम। नमस्ते दुनिया",
    "Emoji: 😀 😃 👍 👍🏽 👍🏿 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪🇫🇷🇯🇵 ❤️ ✨🎉🔥",
    "\tTabbed line\twith\ttabs\t\tand double tabs",
    "Multiple   spaces    between     words  and  pairs",
    "trailing spaces   ",
    "   leading spaces",
    "    ",
    "",
    "Numbers: 1234567 and 3.14159, 42, 007, 1,000,000, 12345678901234567890 and 2024-01-15T12:34:56Z",
    "def f(x):",
    "    return x**2",
    "if (a != b && c >= 10) { printf(\"%d\\n\", a[i]); } // done",
    "See https://example.com/path?query=1&lang=en#frag or http://www.gnu.org/licenses/ for details.",
    "email: someone@example.org, phone +1 (555) 010-9999, price: $3.50",
    "Mixed: naïve café résumé façade coöperate Ångström São Paulo",
    "ALL CAPS SENTENCE WITH WE'VE AND DON'T AND YOU'RE AND I'D.",
    "Punctuation!!! ??? ... --- ''' \"\"\" ((( ))) [[[ ]]] {{{ }}} <<< >>> ''s 'S",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space",
    "Combining: e\u0301 vs \u00e9, A\u030a vs \u00c5, n\u0303 vs \u00f1",
    "Full-width: ＡＢＣ１２３ and half-width ｶﾀｶﾅ",
    "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ = π ≈ 3.14, ½ ¼ ⅞",
    "Currency: $100, €50, £30, ¥1000, ₹500",
    "   \t  mixed whitespace \t ",
    "x=1;y=2;z=x+y  # comment",
    "Repeated: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbbbb",
    "Separators:\u2028line separator,\u0085next line,\u000bvertical tab,\u000cform feed",
    "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 𐍈 ꙮ ﷽",
    "Mixed script: hello世界mir мир123abc",
    "The end.  ",
])

# Texts with newlines inside (the test lines above have none).
MULTILINE = [
    "def f(x):\n    return x**2\n",
    "first line\n\nthird line\n\n\n",
    "\n",
    "  \n  \n",
    "tab\n\tindented\n        deep",
    SAMPLE,
]

# kind -> pipeline and special tokens. Specials are (content, role) in id order; roles name what
# PreTrainedTokenizerFast gets them as (bos/eos/unk/pad, several allowed; "extra" for additional_special_tokens, as
# Qwen2 lists <|im_start|> <|im_end|>; Llama 3 lists none of its other specials). Every one is special=True,
# normalized=False in tokenizer.json's added_tokens.
KINDS = {
    "gpt2": {"vocab": 1500, "specials": [("<|endoftext|>", ("bos", "eos", "unk"))]},
    "llama3": {"vocab": 1500, "specials": [("<|begin_of_text|>", ("bos",)), ("<|end_of_text|>", ("eos",)),
                                           ("<|eot_id|>", ())]},
    "qwen2": {"vocab": 1500, "specials": [("<|endoftext|>", ("eos", "pad")), ("<|im_start|>", ("extra",)),
                                          ("<|im_end|>", ("extra",))]},
    "llama2": {"vocab": 1200, "specials": [("<unk>", ("unk",)), ("<s>", ("bos",)), ("</s>", ("eos",))]},
    # Gemma 1/2/3 put <pad> <eos> <bos> <unk> <mask> first and list <start_of_turn> <end_of_turn> as additional
    # special tokens (their other unused/multimodal specials are left out here); <mask> has no role, as Gemma's
    # tokenizer_config.json names no mask_token.
    "gemma": {"vocab": 1200, "specials": [("<pad>", ("pad",)), ("<eos>", ("eos",)), ("<bos>", ("bos",)),
                                          ("<unk>", ("unk",)), ("<mask>", ()), ("<start_of_turn>", ("extra",)),
                                          ("<end_of_turn>", ("extra",))]},
    # No tokenizer.json: a SentencePiece tokenizer.model (see make_spm). "vocab" is SentencePiece's vocab_size,
    # which counts <unk> <s> </s> and the 256 byte pieces too (as llama2's 1200 + 256).
    "spm": {"vocab": 1456, "specials": [("<unk>", ("unk",)), ("<s>", ("bos",)), ("</s>", ("eos",))]},
}
# What the real tokenizer_config.json files say (Llama 3 ships clean_up_tokenization_spaces true; GPT-2's has
# none and relied on the old default True; Qwen2 and Llama 2 say false). transformers 5 ignores the flag for BPE
# models (decode leaves the text alone and logs a warning), so "decoded" does not depend on it.
CLEANUP = {"gpt2": False, "llama3": True, "qwen2": False, "llama2": False, "gemma": False, "spm": False}
# model_max_length as GPT-2 and Qwen2 say; Llama 2 and Llama 3 (8B) ship transformers' "very large" default
# 1000000000000000019884624838656 (more than a uint64), which is what transformers writes when none is given.
MAX_LENGTH = {"gpt2": 1024, "qwen2": 32768}
# llama3 only: a word whose byte-level form is put into the vocabulary (after the trained tokens) with no merge
# that builds it, so only ignore_merges=True (a whole pre-token found in the vocabulary is one token) yields it.
# Trained merges reproduce every trained token, so without it the flag would change no test id.
IGNORE_MERGES_WORD = " dtensor"
# Byte-fallback kinds: the id of <0x00> (the 256 byte tokens follow in order), as Llama 2 (3) and, nearer the front
# than in the real files (Gemma 1/2: 217), Gemma.
BYTE_FIRST = {"llama2": 3, "gemma": 7, "spm": 3}


def read_corpus():
    """[(name, text)] of every file in LICENSES (sorted), then ("SAMPLE", SAMPLE)."""
    docs = []
    for name in sorted(os.listdir(LICENSES)):
        path = os.path.join(LICENSES, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                docs.append((name, f.read()))
    docs.append(("SAMPLE", SAMPLE))
    return docs


def test_texts(kind):
    texts = SAMPLE.split("\n")
    with open(GPL3, encoding="utf-8", errors="replace") as f:
        texts += [line for line in f.read().split("\n") if line.strip()][:GPL3_LINES]
    texts += MULTILINE
    specials = [s for s, _ in KINDS[kind]["specials"]]
    for s in specials:
        texts += [f"hello {s} world", f"{s}start", f"end{s}", f"{s}", f"  {s}  spaced  {s}"]
    texts += [f"a {ADDED_TOKEN} b", f"x{ADDED_TOKEN}y", ADDED_TOKEN, f"{ADDED_TOKEN} {specials[-1]} {ADDED_TOKEN}",
              f"{specials[0]}{ADDED_TOKEN}{specials[-1]}", f"{ADDED_TOKEN[:-1]} not quite added"]
    if kind == "llama3":
        w = IGNORE_MERGES_WORD
        texts += [f"the{w} library", w.strip(), f"{w}s and{w}", f"({w})"]
    return texts


def build(kind, docs):
    """The trained tokenizers.Tokenizer of KIND with its family's pipeline, specials and ADDED_TOKEN."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    spec = KINDS[kind]
    specials = [s for s, _ in spec["specials"]]

    if kind == "llama2":
        # SentencePiece-style BPE: "▁" for spaces, one prepended; trained word by word (Metaspace split, which
        # only the training uses, as SentencePiece's split_by_whitespace), then applied to the whole normalized
        # text (no pre-tokenizer). Lines, not files, so "\n" stays out of the vocabulary as in Llama 2 (<0x0A>).
        # The alphabet keeps the characters seen at least twice: the rarer ones go through byte fallback.
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
        lines = [line for _, text in docs for line in text.split("\n") if line]
        freq = collections.Counter()
        for line in lines:
            freq.update(("▁" + line).replace(" ", "▁"))
        alphabet = sum(1 for n in freq.values() if n >= 2)
        trainer = trainers.BpeTrainer(vocab_size=spec["vocab"], special_tokens=specials, limit_alphabet=alphabet,
                                      show_progress=False)
        tok.train_from_iterator(lines, trainer)
        tok = with_byte_tokens(tok, specials, BYTE_FIRST[kind])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1, right=0)])
        tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                           special_tokens=[("<s>", 1)])
    elif kind == "gemma":
        # Gemma's tokenizer.json (as transformers' GemmaConverter wrote it): spaces become "▁" in the normalizer,
        # no dummy prefix, no pre-tokenizer (the whole normalized text is one BPE word), byte fallback, <bos>
        # added by a TemplateProcessing, decoder without Strip. Trained on whole documents (so "\n" runs become
        # tokens, as Gemma has "\n", "\n\n", ...) split for the training only into runs of "\n" and words that
        # take the "▁" run before them, or a "▁" run alone (SentencePiece's split_by_whitespace with
        # allow_whitespace_only_pieces, so "▁▁", "▁▁▁▁" can be tokens as in Gemma). Same alphabet limit as llama2.
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+|▁*[^▁\n]+|▁+"), behavior="isolated", invert=False)
        texts = [text for _, text in docs]
        freq = collections.Counter()
        for text in texts:
            freq.update(text.replace(" ", "▁"))
        alphabet = sum(1 for n in freq.values() if n >= 2)
        trainer = trainers.BpeTrainer(vocab_size=spec["vocab"], special_tokens=specials, limit_alphabet=alphabet,
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer)
        tok = with_byte_tokens(tok, specials, BYTE_FIRST[kind])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        tok.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1",
                                                           special_tokens=[("<bos>", 2)])
    else:
        if kind == "gpt2":
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
            if kind == "qwen2":
                tok.normalizer = normalizers.NFC()
            pattern = LLAMA3_PATTERN if kind == "llama3" else QWEN2_PATTERN
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        trainer = trainers.BpeTrainer(vocab_size=spec["vocab"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator([text for _, text in docs], trainer)
        tok.decoder = decoders.ByteLevel()
        if kind == "llama3":
            tok.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|>:0 $A:0",
                    pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
                    special_tokens=[("<|begin_of_text|>", spec["vocab"] + 1)])])
        else:
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
        j = json.loads(tok.to_str())
        if kind == "gpt2":
            # GPT-2's <|endoftext|> (50256) is the last entry of vocab.json as well as an added token; its
            # tokenizer.json spells the unused affixes as "" (Llama 3 and Qwen2: null).
            j["model"]["vocab"][specials[0]] = len(j["model"]["vocab"])
            j["model"]["continuing_subword_prefix"] = ""
            j["model"]["end_of_word_suffix"] = ""
        if kind == "llama3":
            word = tok.pre_tokenizer.pre_tokenize_str(IGNORE_MERGES_WORD)
            assert len(word) == 1, word
            assert word[0][0] not in j["model"]["vocab"]
            j["model"]["vocab"][word[0][0]] = len(j["model"]["vocab"])
        if kind == "qwen2":
            # Qwen2 spells every ByteLevel part with all options off.
            off = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
            j["pre_tokenizer"]["pretokenizers"][1] = dict(off)
            j["post_processor"] = dict(off)
            j["decoder"] = dict(off)
        tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        got = [tok.token_to_id(s) for s in specials]
        first = tok.get_vocab_size(with_added_tokens=False) - (kind == "gpt2")
        assert got == list(range(first, first + len(specials))), got
    tok.add_tokens([ADDED_TOKEN])  # not special; normalized=True as tokenizers defaults for those
    return tok


def with_byte_tokens(tok, specials, first):
    """TOK (trained, its specials at ids 0..first-1) with <0x00>..<0xFF> inserted at ids first..first+255, the
    trained tokens moved up by 256, and no pre-tokenizer (the SentencePiece-style kinds split for training only)."""
    from tokenizers import Tokenizer

    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    assert not set(byte_tokens) & set(vocab), "a trained token looks like a byte token"
    assert [vocab[s] for s in specials] == list(range(first)), vocab
    new = {}
    for t, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        new[t] = i if i < first else i + 256
    for b, t in enumerate(byte_tokens):
        new[t] = first + b
    j["model"]["vocab"] = dict(sorted(new.items(), key=lambda kv: kv[1]))
    j["pre_tokenizer"] = None
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def make_kind(root, kind, docs):
    import transformers
    from tokenizers import Tokenizer

    if kind == "spm":
        return make_spm(root, docs)
    tok = build(kind, docs)
    roles = collections.defaultdict(list)
    for content, rs in KINDS[kind]["specials"]:
        for r in rs:
            roles[r].append(content)
    kw = {f"{r}_token": roles[r][0] for r in ("bos", "eos", "unk", "pad") if r in roles}
    if "bos" not in roles:
        kw["bos_token"] = None
    if "extra" in roles:
        kw["additional_special_tokens"] = roles["extra"]
    if kind in MAX_LENGTH:
        kw["model_max_length"] = MAX_LENGTH[kind]
    out = os.path.join(root, kind)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=CLEANUP[kind],
                                                **kw)
    fast.save_pretrained(out)
    write_special_tokens_map(out, kind, roles)

    hf = transformers.AutoTokenizer.from_pretrained(out)
    raw = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    bad = []
    if json.loads(hf.backend_tokenizer.to_str()) != json.loads(raw.to_str()):
        bad.append(f"{kind}: the tokenizer AutoTokenizer loaded differs from the saved tokenizer.json")
    texts = test_texts(kind)
    nbyte = ndecode = 0
    first = BYTE_FIRST.get(kind, 3)
    with open(os.path.join(out, "expected.jsonl"), "w", encoding="utf-8") as f:
        for text in texts:
            ids = hf(text)["input_ids"]
            want = raw.encode(text, add_special_tokens=True).ids
            if ids != want:
                bad.append(f"{kind}: {text!r}: transformers {ids} != tokenizers {want}")
            nbyte += sum(1 for i in ids if first <= i < first + 256)
            ndecode += hf.decode(ids) != raw.decode(ids, skip_special_tokens=False)
            ndecode += hf.decode(ids, skip_special_tokens=True) != raw.decode(ids, skip_special_tokens=True)
            f.write(json.dumps({"text": text, "ids": ids, "decoded": hf.decode(ids),
                                "decoded_skip": hf.decode(ids, skip_special_tokens=True)}, ensure_ascii=False) + "\n")
    meta = {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id, "pad_token_id": hf.pad_token_id,
            "unk_token_id": hf.unk_token_id, "vocab_size": len(hf),
            "added_token_id": hf.convert_tokens_to_ids(ADDED_TOKEN), "num_texts": len(texts)}
    with open(os.path.join(out, "expected_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    line = f"{kind}: vocab {len(hf)} (model {raw.get_vocab_size(with_added_tokens=False)}), {len(texts)} texts"
    line += ", " + ", ".join(f"{k}={v}" for k, v in meta.items() if k.endswith("_id"))
    if ndecode:
        bad.append(f"{kind}: transformers' decode differs from tokenizers' decode {ndecode} times")
    if kind in BYTE_FIRST:
        line += f", {nbyte} byte-fallback ids"
        if nbyte == 0:
            bad.append(f"{kind}: no test text went through byte fallback")
    if kind == "llama3":
        j = json.loads(raw.to_str())
        j["model"]["ignore_merges"] = False
        merged = Tokenizer.from_str(json.dumps(j))
        n = sum(merged.encode(t).ids != raw.encode(t).ids for t in texts)
        line += f", {n} texts whose ids ignore_merges changes"
        if n == 0:
            bad.append("llama3: ignore_merges changes no test text")
    return line, bad


# Llama 2's tokenizer.model as meta-llama ships it: its trainer_spec and normalizer_spec (printed with
# sentencepiece_model_pb2), less what only describes that run (input, model_prefix, num_threads 80; here 1, so
# that training is deterministic) or what sentencepiece 0.2 no longer takes (self_test_sample_size 0,
# train_extremely_large_corpus false: "deprecated and ignored"), with our vocab_size. model_writer and
# sentence_iterator replace the files.
SPM_TRAINER = dict(
    model_type="bpe", input_format="text", character_coverage=0.99995,
    input_sentence_size=200000000, seed_sentencepiece_size=1000000, shrinking_factor=0.75, num_sub_iterations=2,
    max_sentence_length=4192, shuffle_input_sentence=True, max_sentencepiece_length=16, split_by_unicode_script=True,
    split_by_whitespace=True, split_by_number=True, treat_whitespace_as_suffix=False, split_digits=True,
    allow_whitespace_only_pieces=True, vocabulary_output_piece_score=True, hard_vocab_limit=True, use_all_vocab=False,
    byte_fallback=True, required_chars="", unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_surface=" \u2047 ",
    unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", pad_piece="<pad>", normalization_rule_name="identity",
    add_dummy_prefix=True, remove_extra_whitespaces=False, num_threads=1)
# transformers' "very large" default that Llama 2's tokenizer_config.json carries (more than a uint64).
VERY_LARGE_MAX_LENGTH = 1000000000000000019884624838656


def make_spm(root, docs):
    """ROOT/spm: a SentencePiece-only checkpoint as the old Llama 2 / Mistral repositories ship (tokenizer.model,
    tokenizer_config.json, special_tokens_map.json, no tokenizer.json), with the ids and decodes of the
    `sentencepiece` library and, for comparison only, the ids of transformers' conversion."""
    import io

    import sentencepiece as spm
    import transformers

    out = os.path.join(root, "spm")
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "tokenizer.json")):
        os.remove(os.path.join(out, "tokenizer.json"))
    # Lines, as llama2, so "\n" goes through byte fallback (<0x0A>) as in Llama 2.
    lines = [line for _, text in docs for line in text.split("\n") if line]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=KINDS["spm"]["vocab"], minloglevel=2, **SPM_TRAINER)
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())

    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False}

    # meta-llama/Llama-2-7b-hf's tokenizer_config.json (Mistral-7B-v0.1 says legacy true, with which
    # transformers 5 adds a "▁" after a literal special token: only hf_ids change, on 4 of these texts).
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": added("<s>"),
              "clean_up_tokenization_spaces": CLEANUP["spm"], "eos_token": added("</s>"), "legacy": False,
              "model_max_length": VERY_LARGE_MAX_LENGTH, "pad_token": None, "padding_side": "right",
              "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": added("<unk>")}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    roles = {"unk": ["<unk>"], "bos": ["<s>"], "eos": ["</s>"]}
    write_special_tokens_map(out, "spm", roles)

    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    hf = transformers.AutoTokenizer.from_pretrained(out)
    bad = []
    bos = sp.bos_id()
    specials = [s for s, _ in KINDS["spm"]["specials"]]
    texts = test_texts("spm")
    nbyte = round_trips = hf_decode_differs = 0
    differ = collections.Counter()
    first = BYTE_FIRST["spm"]
    with open(os.path.join(out, "expected.jsonl"), "w", encoding="utf-8") as f:
        for text in texts:
            ids = [bos] + sp.encode(text)
            decoded = sp.decode(ids)  # <s> and </s> are control pieces: sentencepiece decodes them to nothing
            hf_ids = hf(text)["input_ids"]
            nbyte += sum(1 for i in ids if first <= i < first + 256)
            round_trips += decoded == text
            hf_decode_differs += hf.decode(ids, skip_special_tokens=True) != decoded
            if hf_ids != ids:
                if any(s in text for s in specials):
                    differ["a literal <unk> <s> </s>"] += 1
                elif text.startswith(" ") and hf_ids == [bos] + sp.encode(text[1:]):
                    differ["a leading space, ids = [<s>] + sp.encode(text[1:])"] += 1
                else:
                    differ["other"] += 1
            f.write(json.dumps({"text": text, "ids": ids, "decoded": decoded, "decoded_skip": decoded,
                                "hf_ids": hf_ids}, ensure_ascii=False) + "\n")
    meta = {"bos_token_id": bos, "eos_token_id": sp.eos_id(), "pad_token_id": sp.pad_id() if sp.pad_id() >= 0 else None,
            "unk_token_id": sp.unk_id(), "vocab_size": sp.get_piece_size(), "added_token_id": None,
            "num_texts": len(texts)}
    with open(os.path.join(out, "expected_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    hf_meta = {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id, "pad_token_id": hf.pad_token_id,
               "unk_token_id": hf.unk_token_id, "vocab_size": len(hf)}
    if any(meta[k] != v for k, v in hf_meta.items()):
        bad.append(f"spm: transformers' special ids / vocabulary size {hf_meta} differ from sentencepiece's {meta}")
    if nbyte == 0:
        bad.append("spm: no test text went through byte fallback")
    line = f"spm: vocab {sp.get_piece_size()} (sentencepiece {spm.__version__}), {len(texts)} texts"
    line += ", " + ", ".join(f"{k}={v}" for k, v in meta.items() if k.endswith("_id"))
    line += f", {nbyte} byte-fallback ids, {round_trips} round trips"
    ndiffer = sum(differ.values())
    line += f"; transformers {transformers.__version__} ({type(hf).__name__}): hf_ids differ on {ndiffer} texts"
    if differ:
        line += " (" + ", ".join(f"{n} with {what}" for what, n in differ.items()) + ")"
    line += f", decode(skip_special_tokens=True) differs on {hf_decode_differs}"
    return line, bad


def write_special_tokens_map(out, kind, roles):
    """special_tokens_map.json as the real checkpoints have it (written by transformers 4; transformers 5 no longer
    writes the file, and reads it only when tokenizer_config.json has no added_tokens_decoder, as here)."""
    def entry(content):
        if kind == "gpt2":
            return content
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    m = {f"{r}_token": entry(roles[r][0]) for r in ("bos", "eos", "unk", "pad") if r in roles}
    if "extra" in roles:
        m["additional_special_tokens"] = list(roles["extra"])
    with open(os.path.join(out, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(dict(sorted(m.items())), f, indent=2, ensure_ascii=False)
        f.write("\n")


def bench(root, kind, repeat):
    if kind == "spm":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=os.path.join(root, kind, "tokenizer.model"))
        encode_batch = lambda ts: [[sp.bos_id()] + ids for ids in sp.encode(ts, num_threads=1)]  # noqa: E731
        encode = lambda t: [sp.bos_id()] + sp.encode(t)  # noqa: E731
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(root, kind, "tokenizer.json"))
        encode_batch = lambda ts: [e.ids for e in tok.encode_batch(ts, add_special_tokens=True)]  # noqa: E731
        encode = lambda t: tok.encode(t, add_special_tokens=True).ids  # noqa: E731
    texts = test_texts(kind) + [line for _, text in read_corpus() for line in text.split("\n")]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    for mode in ("encode_batch", "encode"):
        tokens = 0
        t0 = time.perf_counter()
        for _ in range(repeat):
            if mode == "encode_batch":
                tokens += sum(len(ids) for ids in encode_batch(texts))
            else:
                for t in texts:
                    tokens += len(encode(t))
        dt = time.perf_counter() - t0
        print(f"hf_tokens_per_s={tokens / dt:.1f} tokens={tokens} seconds={dt:.4f} mode={mode} "
              f"texts={len(texts) * repeat} bytes={nbytes * repeat}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["make", "list", "bench"])
    p.add_argument("paths", nargs="*", help="make: ROOT; bench: ROOT KIND")
    p.add_argument("--kinds", default=None, help="comma list (make); default: all")
    p.add_argument("--repeat", type=int, default=1, help="bench: passes over the texts")
    a = p.parse_args()

    if a.mode == "list":
        print("\n".join(KINDS))
        return 0
    if (a.mode == "make" and len(a.paths) != 1) or (a.mode == "bench" and len(a.paths) != 2):
        p.error(f"{a.mode} needs {'ROOT' if a.mode == 'make' else 'ROOT KIND'}")
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    if a.mode == "bench":
        if a.paths[1] not in KINDS:
            p.error(f"unknown kind {a.paths[1]}; known: {', '.join(KINDS)}")
        bench(a.paths[0], a.paths[1], a.repeat)
        return 0

    import transformers
    transformers.utils.logging.set_verbosity_error()
    names = a.kinds.split(",") if a.kinds else list(KINDS)
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        p.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    os.makedirs(a.paths[0], exist_ok=True)
    docs = read_corpus()
    t0 = time.perf_counter()
    bad = []
    for kind in names:
        line, b = make_kind(a.paths[0], kind, docs)
        print(line, flush=True)
        bad += b
    for b in bad:
        print(b)
    print(f"made {len(names)} kinds ({time.perf_counter() - t0:.1f} s){', MISMATCHES' if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
