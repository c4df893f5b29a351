// serve's pieces without a model or a network: the scheduler (chunked prefill within the token budget, KV blocks
// handed out and taken back, preemption of the youngest sequence when the pool runs out, recompute on readmission),
// stop strings held back across tokens (TextOutput), and the OpenAI request checks (400 naming the field).
#include <gtest/gtest.h>

#include <string>

#include "inference/serving/ngram_proposer.h"
#include "inference/serving/openai_api.h"
#include "inference/serving/tool_parsers.h"
#include "inference/serving/scheduler.h"
#include "inference/serving/text_output.h"

namespace {

// Characters as tokens: "a".."z" are 0..25, " " is 26.
const tokenizer::Tokenizer& chars() {
  static const tokenizer::Tokenizer tok = [] {
    std::string vocab;
    for (int i = 0; i < 26; ++i) vocab += "\"" + std::string(1, static_cast<char>('a' + i)) + "\": " + std::to_string(i) + ", ";
    vocab += "\" \": 26";
    return tokenizer::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {)" + vocab + R"(}, "merges": []}})");
  }();
  return tok;
}

std::unique_ptr<serve::Sequence> sequence(std::vector<int64_t> prompt, std::vector<std::string> stop = {}) {
  serve::ApiRequest api;
  api.prompt_ids = std::move(prompt);
  api.params.stop = std::move(stop);
  api.params.temperature = 0;
  return std::make_unique<serve::Sequence>(std::make_shared<serve::Request>(api, "r", 0), chars(), 0);
}

// What a step computes per sequence: (first position, tokens, wants logits).
struct Computed {
  int64_t start;
  size_t n;
  bool logits;
};
std::vector<Computed> computed(const serve::Scheduler::Batch& b) {
  std::vector<Computed> out;
  for (const auto& c : b.chunks) out.push_back({c.start, c.tokens.size(), c.logits > 0});
  return out;
}

TEST(ServeScheduler, PrefillsInChunksWithinTheTokenBudgetThenDecodesOneToken) {
  serve::Scheduler s(/*num_blocks=*/8, /*block_size=*/4, /*max_num_seqs=*/4, /*max_num_batched_tokens=*/3);
  auto seq = sequence({0, 1, 2, 3, 4, 5, 6});
  serve::Sequence* p = seq.get();
  s.add(std::move(seq));
  auto b1 = computed(s.schedule());
  ASSERT_EQ(b1.size(), 1u);
  EXPECT_EQ(b1[0].start, 0);
  EXPECT_EQ(b1[0].n, 3u);
  EXPECT_FALSE(b1[0].logits);
  auto b2 = computed(s.schedule());
  EXPECT_EQ(b2[0].start, 3);
  EXPECT_EQ(b2[0].n, 3u);
  auto b3 = computed(s.schedule());
  EXPECT_EQ(b3[0].start, 6);
  EXPECT_EQ(b3[0].n, 1u);
  EXPECT_TRUE(b3[0].logits);  // the prompt's last token: its logits draw the first new token
  EXPECT_EQ(s.blocks().used(), 2);  // 7 positions in blocks of 4
  p->tokens.push_back(9);  // the drawn token
  auto b4 = computed(s.schedule());
  EXPECT_EQ(b4[0].start, 7);
  EXPECT_EQ(b4[0].n, 1u);
  EXPECT_TRUE(b4[0].logits);
  s.remove(p);
  EXPECT_EQ(s.blocks().used(), 0);
  EXPECT_EQ(s.running(), 0);
}

TEST(ServeScheduler, PreemptsTheYoungestWhenBlocksRunOutAndRecomputesItLater) {
  // 3 blocks of 2 positions: two sequences of 2-token prompts fit (one block each), then grow.
  serve::Scheduler s(3, 2, 4, 16);
  auto a = sequence({0, 1}), b = sequence({2, 3});
  serve::Sequence *pa = a.get(), *pb = b.get();
  s.add(std::move(a));
  s.add(std::move(b));
  EXPECT_EQ(computed(s.schedule()).size(), 2u);
  EXPECT_EQ(s.blocks().used(), 2);
  pa->tokens.push_back(5);
  pb->tokens.push_back(6);
  // Position 2 of each needs a second block; only one is free: a (older) takes it, b is preempted.
  auto step = s.schedule();
  ASSERT_EQ(step.seqs.size(), 1u);
  EXPECT_EQ(step.seqs[0], pa);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(pb->computed, 0);
  EXPECT_TRUE(pb->blocks.empty());
  EXPECT_EQ(s.blocks().used(), 2);
  // a finishes; b is readmitted and recomputes its prompt and drawn token in one chunk.
  s.remove(pa);
  auto again = s.schedule();
  ASSERT_EQ(again.seqs.size(), 1u);
  EXPECT_EQ(again.seqs[0], pb);
  EXPECT_EQ(again.chunks[0].start, 0);
  EXPECT_EQ(again.chunks[0].tokens, (std::vector<int64_t>{2, 3, 6}));
  EXPECT_TRUE(again.chunks[0].logits);
}

TEST(ServeScheduler, AdmitsOnlyWhatTheFreeBlocksHold) {
  serve::Scheduler s(2, 4, 2, 64);
  std::vector<serve::Sequence*> seqs;
  for (int i = 0; i < 3; ++i) {
    auto q = sequence({0, 1, 2, 3, 4});  // 2 blocks each
    seqs.push_back(q.get());
    s.add(std::move(q));
  }
  auto first = s.schedule();
  EXPECT_EQ(first.seqs.size(), 1u);  // the second needs 2 more blocks: it waits
  EXPECT_EQ(s.waiting(), 2);
  s.remove(seqs[0]);
  EXPECT_EQ(s.schedule().seqs.size(), 1u);
}

std::vector<int64_t> ids(const std::string& text) { return chars().encode(text, false); }

std::string stream(const std::string& text, std::vector<std::string> stop, bool& stopped) {
  serve::TextOutput out(chars(), ids("x"), std::move(stop));
  std::string got;
  for (int64_t id : ids(text)) {
    got += out.put(id);
    if (out.stopped()) break;
  }
  got += out.end();
  stopped = out.stopped();
  return got;
}

TEST(ServeTextOutput, StopStringsAreHeldBackAcrossTokensAndCut) {
  bool stopped = false;
  EXPECT_EQ(stream("hello world", {"o w"}, stopped), "hell");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(stream("hello world", {"o x"}, stopped), "hello world");  // a false start is released
  EXPECT_FALSE(stopped);
  EXPECT_EQ(stream("abcabd", {"abd", "zz"}, stopped), "abc");
  EXPECT_TRUE(stopped);
  // Held back: after "hel" with stop "lo", the "l" waits for the next token.
  serve::TextOutput out(chars(), ids("x"), {"lo"});
  EXPECT_EQ(out.put(ids("h")[0]), "h");
  EXPECT_EQ(out.put(ids("e")[0]), "e");
  EXPECT_EQ(out.put(ids("l")[0]), "");
  EXPECT_EQ(out.put(ids("p")[0]), "lp");
}

serve::ApiError error_of(const std::string& body, bool chat = false) {
  serve::ApiLimits limits{&chars(), "m", 16, 27};
  try {
    serve::parse_request(body, chat, limits);
  } catch (const serve::ApiError& e) {
    return e;
  }
  return serve::ApiError(0, "no error");
}

TEST(ServeOpenAiApi, BadRequestsNameTheField) {
  EXPECT_EQ(error_of("{\"prompt\": ").status, 400);
  EXPECT_EQ(error_of("[1, 2]").status, 400);
  EXPECT_EQ(error_of(R"({"prompt": "ab", "foo": 1})").param, "foo");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "max_tokens": 0})").param, "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "max_tokens": 15})").param, "max_tokens");  // 2 + 15 > 16
  EXPECT_EQ(error_of(R"({"prompt": "abcdefghijklmnopq"})").param, "prompt");      // 17 tokens >= 16
  EXPECT_EQ(error_of(R"({"prompt": "ab", "temperature": -1})").param, "temperature");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "top_p": 0})").param, "top_p");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "top_k": -2})").param, "top_k");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "stop": ["a", "b", "c", "d", "e"]})").param, "stop");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "n": 65})").param, "n");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "stream_options": {"include_usage": true}})").param, "stream_options");
  EXPECT_EQ(error_of(R"({"prompt": [1, 99]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"]})").param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": "ab", "model": "other"})").status, 404);
  EXPECT_EQ(error_of(R"({"messages": []})", true).param, "messages");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "ab"}]})", true).param, "messages");  // no template
}

TEST(ServeOpenAiApi, DefaultsAreOpenAis) {
  serve::ApiLimits limits{&chars(), "m", 16, 27};
  const auto r = serve::parse_request(R"({"prompt": "ab", "stop": "x", "seed": 3, "stream": true})", false, limits);
  EXPECT_EQ(r.prompt_ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r.params.max_tokens, 14);  // OpenAI's 16, capped by the context left
  EXPECT_EQ(r.params.temperature, 1.0);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(*r.params.seed, 3u);
  EXPECT_TRUE(r.stream);
}

}  // namespace

// Prefix caching (block_pool.h): full blocks are found by the hash chain of their tokens, shared with a count,
// kept after release until evicted least recently used first; a block's own tokens are compared, not only hashed.
TEST(ServePrefixCache, FindsTheLongestCachedRunAndSharesItsBlocks) {
  serve::BlockAllocator pool(6, /*prefix_caching=*/true);
  std::vector<int64_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // two full blocks of 4, then 2 tokens
  std::vector<int64_t> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*pool.allocate());
  pool.cache(a, blocks, 4, /*computed=*/10);
  EXPECT_EQ(pool.cached(), 2);  // the partial third block is not cached
  std::vector<int64_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0};
  auto hit = pool.match(b, 4, 2);
  EXPECT_EQ(hit, (std::vector<int64_t>{blocks[0], blocks[1]}));
  EXPECT_EQ(pool.hit_tokens(), 8);
  EXPECT_EQ(pool.queried_tokens(), 8);
  // Another first block: nothing after it is found either (the chain), even with the same second block.
  std::vector<int64_t> c = {9, 2, 3, 4, 5, 6, 7, 8, 0};
  EXPECT_TRUE(pool.match(c, 4, 2).empty());
  EXPECT_EQ(pool.used(), 3);  // shared blocks are counted once
  pool.release(hit);
  pool.release(blocks);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.cached(), 2);  // released, still findable
  EXPECT_EQ(pool.match(a, 4, 2).size(), 2u);
}

TEST(ServePrefixCache, EvictsTheLeastRecentlyUsedCachedBlockLast) {
  serve::BlockAllocator pool(3, true);
  std::vector<int64_t> x = {1, 1}, y = {2, 2};
  std::vector<int64_t> bx = {*pool.allocate()}, by = {*pool.allocate()};
  pool.cache(x, bx, 2, 2);
  pool.cache(y, by, 2, 2);
  const int64_t keep = by[0];
  pool.release(bx);  // x first: the least recently used
  pool.release(by);
  auto fresh = *pool.allocate();  // the never-cached free block goes first
  EXPECT_NE(fresh, keep);
  EXPECT_EQ(pool.cached(), 2);
  auto evicted = *pool.allocate();  // then x's block, evicted
  EXPECT_NE(evicted, keep);
  EXPECT_EQ(pool.cached(), 1);
  EXPECT_TRUE(pool.match(x, 2, 1).empty());
  EXPECT_EQ(pool.match(y, 2, 1), (std::vector<int64_t>{keep}));
  EXPECT_FALSE(pool.allocate().has_value());  // y's block is in use again
}

TEST(ServePrefixCache, OffFindsNothing) {
  serve::BlockAllocator pool(2, false);
  std::vector<int64_t> t = {1, 2}, b = {*pool.allocate()};
  pool.cache(t, b, 2, 2);
  EXPECT_TRUE(pool.match(t, 2, 1).empty());
  EXPECT_EQ(pool.cached(), 0);
}

TEST(ServePrefixCache, ASecondSequenceComputesOnlyWhatFollowsTheSharedPrefix) {
  serve::Scheduler s(/*num_blocks=*/8, /*block_size=*/4, /*max_num_seqs=*/4, /*max_num_batched_tokens=*/64,
                     /*prefix_caching=*/true);
  s.add(sequence({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  auto first = computed(s.schedule());
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].n, 10u);
  s.add(sequence({0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22}));  // the same first two blocks
  s.add(sequence({0, 1, 2, 3, 4, 5, 6, 7}));              // all of them: the last token is computed again
  auto next = computed(s.schedule());
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[1].start, 8);
  EXPECT_EQ(next[1].n, 3u);
  EXPECT_EQ(next[2].start, 4);  // one block found: the second would leave nothing to compute
  EXPECT_EQ(next[2].n, 4u);
  EXPECT_EQ(s.blocks().hit_tokens(), 12);
}

// Prompt lookup (ngram_proposer.h): the tokens after the latest earlier occurrence of the longest recurring suffix.
TEST(ServeSpeculation, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  serve::SpeculativeConfig c{3, 3, 1};
  EXPECT_EQ(serve::propose_ngram({1, 2, 3, 9, 1, 2, 3, 7, 1, 2}, c, 8), (std::vector<int64_t>{3, 7, 1}));  // "1 2" latest
  EXPECT_EQ(serve::propose_ngram({5, 6, 7, 5, 6}, c, 8), (std::vector<int64_t>{7, 5, 6}));
  EXPECT_EQ(serve::propose_ngram({5, 6, 7, 5, 6}, c, 2), (std::vector<int64_t>{7, 5}));  // the room left
  EXPECT_TRUE(serve::propose_ngram({1, 2, 3, 4}, c, 8).empty());                          // nothing recurs
  serve::SpeculativeConfig two{3, 3, 2};
  EXPECT_TRUE(serve::propose_ngram({4, 1, 5, 1}, two, 8).empty());  // only a 1-gram recurs
  EXPECT_THROW(serve::parse_speculative_config(R"({"method": "eagle"})"), std::invalid_argument);
  EXPECT_THROW(serve::parse_speculative_config(R"({"num_speculative_tokens": 0})"), std::invalid_argument);
  EXPECT_THROW(serve::parse_speculative_config(R"({"bogus": 1})"), std::invalid_argument);
  EXPECT_EQ(serve::parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5})").num_speculative_tokens, 5);
}

TEST(ServeSpeculation, ADecodingSequenceScoresItsDraftInOneChunk) {
  serve::Scheduler s(/*num_blocks=*/8, /*block_size=*/4, /*max_num_seqs=*/4, /*max_num_batched_tokens=*/64);
  auto seq = sequence({0, 1, 2});
  serve::Sequence* p = seq.get();
  s.add(std::move(seq));
  s.schedule();                      // the prompt
  p->tokens.push_back(7);            // a drawn token
  p->draft = {8, 9};
  auto b = s.schedule();
  ASSERT_EQ(b.chunks.size(), 1u);
  EXPECT_EQ(b.chunks[0].tokens, (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(b.chunks[0].start, 3);
  EXPECT_EQ(b.chunks[0].logits, 3);  // the last token's and each draft token's
  EXPECT_EQ(p->computed, 6);         // until the serving loop takes back what it rejects
}

// Tool calls parsed back (tool_parsers.h), in the formats the families emit (vLLM's parsers' own examples' shapes).
TEST(ServeToolParsers, ParseEachFamilysFormatAndLeaveOtherTextAsContent) {
  auto hermes = serve::parse_tool_calls(
      "hermes", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(hermes.calls.size(), 2u);
  EXPECT_EQ(hermes.calls[0].name, "get_weather");
  EXPECT_EQ(hermes.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(hermes.calls[1].arguments, "{}");
  EXPECT_EQ(hermes.content, "Let me check.");
  auto llama = serve::parse_tool_calls(
      "llama3_json", "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"tp\"}}; {\"name\": \"add\", \"parameters\": {\"a\": 1}}");
  ASSERT_EQ(llama.calls.size(), 2u);
  EXPECT_EQ(llama.calls[0].name, "search");
  EXPECT_EQ(llama.calls[1].arguments, R"({"a":1})");
  EXPECT_EQ(llama.content, "");
  auto mistral = serve::parse_tool_calls(
      "mistral", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]");
  ASSERT_EQ(mistral.calls.size(), 1u);
  EXPECT_EQ(mistral.calls[0].arguments, R"({"city":"Rome"})");
  // Not a call (plain text, a malformed call, the wrong format's marker): all of it is content.
  for (const auto& [parser, text] : std::vector<std::pair<std::string, std::string>>{
           {"hermes", "Just text."}, {"hermes", "<tool_call>{\"name\": 3}</tool_call>"}, {"llama3_json", "{not json"},
           {"mistral", "[TOOL_CALLS] nothing"}, {"llama3_json", "Sure: {\"name\": \"x\", \"parameters\": {}}"}}) {
    auto p = serve::parse_tool_calls(parser, text);
    EXPECT_TRUE(p.calls.empty()) << parser << ": " << text;
    EXPECT_EQ(p.content, text) << parser;
  }
  EXPECT_THROW(serve::parse_tool_calls("nope", ""), std::invalid_argument);
}
