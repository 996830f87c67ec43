// Package tokenize turns an OpenAI request's prompt into the engine's
// token ids with the engine's own tokenizer and chat template (vLLM's
// POST /tokenize), as prefixd proxy and the endpoint picker (package
// epp) both do: Client asks an engine and keeps the answers in Cache,
// bounded in entries and bytes, for identical prompts. Request reads
// what a frontend needs of a completions or chat body (the model, a
// prompt given as token ids, the /tokenize body).
package tokenize
