package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Message is one chat message of the OpenAI API.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is one request of the chat workload.
type ChatRequest struct {
	Messages  []Message
	MaxTokens int
}

// ChatWorkload is Workload as chat text: the same conversations (shared
// system prompts of SystemTokens words, growing histories, a new user
// message per turn), each word one token of the mock engines' tokenizer,
// sent as OpenAI chat requests. A turn's history carries the workload's
// own answer of the turn before (as a recorded conversation replayed),
// so every routing mode sends the same requests.
func ChatWorkload(cfg Config) []ChatRequest {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	next := 0 // fresh words: user messages and answers never repeat
	fresh := func(prefix string, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(prefix + strconv.Itoa(next))
			next++
		}
		return b.String()
	}
	system := make([]string, cfg.SystemPrompts)
	for i := range system {
		var b strings.Builder
		fmt.Fprintf(&b, "You are assistant %d.", i)
		for j := range cfg.SystemTokens {
			fmt.Fprintf(&b, " s%dw%d", i, j)
		}
		system[i] = b.String()
	}
	pickSystem := func() []Message {
		for {
			i := rng.IntN(cfg.SystemPrompts)
			if rng.Float64() < 1/float64(i+1) { // popular system prompts are used more
				return []Message{{Role: "system", Content: system[i]}}
			}
		}
	}
	type conv struct {
		msgs  []Message
		words int
	}
	convs := make([]conv, cfg.Conversations)
	for i := range convs {
		convs[i] = conv{msgs: pickSystem(), words: cfg.SystemTokens}
	}
	out := make([]ChatRequest, 0, cfg.Requests)
	for len(out) < cfg.Requests {
		c := &convs[rng.IntN(len(convs))]
		if c.words > 2500 {
			*c = conv{msgs: pickSystem(), words: cfg.SystemTokens}
		}
		user := 32 + rng.IntN(128)
		answer := 16 + rng.IntN(48)
		c.msgs = append(c.msgs, Message{Role: "user", Content: fresh("u", user)})
		out = append(out, ChatRequest{Messages: c.msgs[:len(c.msgs):len(c.msgs)], MaxTokens: answer})
		c.msgs = append(c.msgs, Message{Role: "assistant", Content: fresh("a", answer)})
		c.words += user + answer
	}
	return out
}

// chatResult is what a client saw of one streamed chat request.
type chatResult struct {
	TTFT, Latency time.Duration
	Tokens        int    // content chunks received
	Worker        uint64 // X-Prefixd-Worker
	PrefillWorker uint64 // X-Prefixd-Prefill-Worker, for a remote prefill
}

// chat sends r to an OpenAI endpoint (base) as a streamed chat
// completion and measures, as a client does, the time to the first
// content chunk and to the end of the stream.
func chat(ctx context.Context, hc *http.Client, base, model string, r ChatRequest) (chatResult, error) {
	var res chatResult
	body, err := json.Marshal(map[string]any{"model": model, "messages": r.Messages, "max_tokens": r.MaxTokens, "stream": true})
	if err != nil {
		return res, err
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return res, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	res.Worker, _ = strconv.ParseUint(resp.Header.Get("X-Prefixd-Worker"), 10, 64)
	res.PrefillWorker, _ = strconv.ParseUint(resp.Header.Get("X-Prefixd-Prefill-Worker"), 10, 64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.Latency = time.Since(start)
			return res, nil
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return res, fmt.Errorf("chunk %q: %w", data, err)
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			if res.Tokens == 0 {
				res.TTFT = time.Since(start)
			}
			res.Tokens++
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	return res, fmt.Errorf("the stream ended without [DONE]")
}
