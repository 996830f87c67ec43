package mocker

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

func TestTokenizePieces(t *testing.T) {
	t.Parallel()
	var got []string
	forEachPiece("<|im_start|>user\nHello world, how  are you?<|im_end|>\n"+strings.Repeat("a", 20), func(p string, _ int) { got = append(got, p) })
	want := []string{"<|im_start|>", "user", "\n", "Hello", " world", ",", " how", " ", " are", " you", "?", "<|im_end|>", "\n",
		strings.Repeat("a", 16), "aaaa"}
	if !slices.Equal(got, want) {
		t.Fatalf("pieces %q\nwant   %q", got, want)
	}
	ids := Tokenize("<|im_start|>user\nHello world")
	if len(ids) != 5 || ids[0] != SpecialBase+1 || ids[3] != PieceID("Hello") || ids[4] != PieceID(" world") {
		t.Fatalf("ids %v", ids)
	}
	for _, id := range Tokenize("ünïcödé 𝔘 \x00\xff — déjà vu!") {
		if id >= SpecialBase {
			t.Fatalf("ordinary piece id %d at or above %d", id, SpecialBase)
		}
	}
	if len(Tokenize("")) != 0 {
		t.Fatal("the empty text has tokens")
	}
}

var textAtoms = []string{"hello", "world", "x1", "déjà", "42", " ", "  ", ",", ".", "\n", "\t", "<|im_start|>", "<|im_end|>", "?!", "—"}

func genText(t *rapid.T, label string) string {
	return strings.Join(rapid.SliceOfN(rapid.SampledFrom(textAtoms), 0, 12).Draw(t, label), "")
}

// TestTokenizePrefixStable: a text extended at a word boundary (by a text
// not beginning with a letter or digit) extends its tokens.
func TestTokenizePrefixStable(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		a, b := genText(t, "a"), genText(t, "b")
		if r, _ := utf8.DecodeRuneInString(b); b != "" && isWord(r) {
			t.Skip("b begins inside a word")
		}
		if got, want := Tokenize(a+b), slices.Concat(Tokenize(a), Tokenize(b)); !slices.Equal(got, want) {
			t.Fatalf("Tokenize(%q+%q) = %v, want %v", a, b, got, want)
		}
	})
}

// TestChatPromptPrefix: a conversation's prompt, and its tokens, are a
// prefix of the prompt of the conversation with one more turn; the
// generation prompt followed by the generated tokens is the start of the
// assistant's turn in the next request, token for token.
func TestChatPromptPrefix(t *testing.T) {
	t.Parallel()
	msgs := []Message{{"system", "You are terse."}, {"user", "Hello there, model."}}
	p1 := ChatPrompt(msgs, true)
	if want := "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there, model.<|im_end|>\n<|im_start|>assistant\n"; p1 != want {
		t.Fatalf("prompt %q", p1)
	}
	t1 := Tokenize(p1)
	seed := OutputSeed(t1)
	var gen []uint32
	var answer strings.Builder
	for i := range 5 {
		id, piece := OutputToken(seed, i)
		gen = append(gen, id)
		answer.WriteString(piece)
	}
	next := append(slices.Clone(msgs), Message{"assistant", answer.String()}, Message{"user", "More?"})
	t2 := Tokenize(ChatPrompt(next, true))
	if !slices.Equal(t2[:len(t1)+len(gen)], slices.Concat(t1, gen)) {
		t.Fatalf("the next turn's prompt does not extend the first prompt and its answer:\n%v\n%v", t2, slices.Concat(t1, gen))
	}
	if !strings.HasPrefix(ChatPrompt(next, false), ChatPrompt(msgs, false)) {
		t.Fatal("a conversation's prompt is not a prefix of the longer one's")
	}
	if got := Detokenize(gen); got != answer.String() {
		t.Fatalf("Detokenize %q, want %q", got, answer.String())
	}
}

// TestOutputToken: the same seed generates the same tokens; each is one
// piece that tokenizes to its id.
func TestOutputToken(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := range 200 {
		id, piece := OutputToken(7, i)
		if id2, piece2 := OutputToken(7, i); id2 != id || piece2 != piece {
			t.Fatal("OutputToken is not deterministic")
		}
		if ids := Tokenize(piece); len(ids) != 1 || ids[0] != id {
			t.Fatalf("piece %q tokenizes to %v, not [%d]", piece, ids, id)
		}
		seen[piece] = true
	}
	if len(seen) < 50 {
		t.Fatalf("only %d distinct words in 200 tokens", len(seen))
	}
	if OutputSeed(toks(0, 5)) == OutputSeed(toks(1, 5)) {
		t.Fatal("different prompts share a seed")
	}
}

// FuzzTokenize: any text tokenizes without panicking into ids within the
// vocabulary, deterministically, and splitting it before a rune that is
// not a letter or digit (outside a special token) splits its tokens.
func FuzzTokenize(f *testing.F) {
	f.Add("<|im_start|>user\nHello, world<|im_end|>\n")
	f.Add("\xff\xfe<|im_")
	f.Fuzz(func(t *testing.T, text string) {
		ids := Tokenize(text)
		for _, id := range ids {
			if id >= VocabSize {
				t.Fatalf("id %d out of the vocabulary", id)
			}
		}
		if !slices.Equal(ids, Tokenize(text)) {
			t.Fatal("not deterministic")
		}
		for i, r := range text {
			if isWord(r) || r == utf8.RuneError || strings.Contains(text, "<|") {
				continue
			}
			if got := slices.Concat(Tokenize(text[:i]), Tokenize(text[i:])); !slices.Equal(got, ids) {
				t.Fatalf("split at %d: %v, whole %v", i, got, ids)
			}
		}
	})
}

func BenchmarkTokenize(b *testing.B) {
	text := ChatPrompt([]Message{{"system", strings.Repeat("You are a helpful assistant. ", 40)}, {"user", strings.Repeat("Tell me about KV caches, please. ", 60)}}, true)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		Tokenize(text)
	}
}
