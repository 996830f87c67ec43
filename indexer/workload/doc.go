// Package workload generates deterministic KV-cache event streams for
// benchmarking and testing the prefix index.
//
// Generate simulates a fleet of vLLM-style engine ranks serving multi-turn
// chat conversations with shared system prompts, and returns the engine
// events (already decoded into indexer ops) the fleet would publish:
//
//   - Each conversation is routed stickily to one rank, preferring ranks
//     that already hold its system prompt (as a KV-aware router would).
//   - A request stores only the blocks its rank does not already hold: the
//     prefill stores the new prompt blocks (in chunked-prefill chunks) with
//     the last cached block as parent, then the decode stores the answer one
//     block per event.
//   - Some conversations fork from an earlier turn of another (regenerate
//     or edit), sharing its prefix on the same rank.
//   - Each rank has a block capacity; when it is full the rank evicts the
//     tail blocks of its least recently used conversations, leaf first, and
//     publishes them as one remove event per allocation.
//   - Engine block hashes are opaque and per rank: the same prefix has a
//     different engine hash on every rank (as vLLM with a random NONE_HASH).
//
// After the target number of (block, rank) entries is reached, a few long
// prompts (LongPromptBlocks blocks, 8,192 tokens by default) are served on
// several ranks, so that scoring benchmarks have long prompts that are
// fully indexed.
//
// LLMDCompare builds the llm-d comparison workload instead (one 512-block
// prompt held to different depths by 8 ranks, plus 1,048,576 background
// blocks).
//
// The package does no I/O. It uses its own random number generator rather
// than math/rand, so a seed yields the same events across Go versions.
package workload
