// Package tokenize turns an OpenAI request's prompt into the engine's
// token ids with the engine's own tokenizer and chat template (vLLM's
// POST /tokenize), as prefixd proxy and the endpoint picker (package
// epp) both do: Client asks an engine and keeps the answers in Cache,
// bounded in entries and bytes, for identical prompts. Read is the one
// reader of a completions or chat body, the proxy's and the picker's
// (the model, stream, a prompt given as token ids, every member for a
// rewrite, the /tokenize body).
package tokenize
