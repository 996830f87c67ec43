package mocker

import (
	"hash/fnv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// VocabSize is the mock tokenizer's vocabulary (Llama 3's size): ordinary
// pieces hash into [0, SpecialBase), the special tokens sit above.
const (
	VocabSize   = 128256
	SpecialBase = 128000
)

// The special tokens of ChatPrompt's ChatML template, each one token.
const (
	TokEndOfText = "<|endoftext|>"
	TokImStart   = "<|im_start|>"
	TokImEnd     = "<|im_end|>"
)

var specials = []string{TokEndOfText, TokImStart, TokImEnd}

// maxPieceRunes caps an ordinary word piece; longer runs of letters and
// digits are cut into pieces of this many runes.
const maxPieceRunes = 16

// Tokenize splits text into pieces and maps each to a token id: a special
// token (TokImStart, TokImEnd, TokEndOfText) is one piece with its fixed id
// (SpecialBase + i); a run of letters and digits is a piece (cut every
// maxPieceRunes runes), taking a single space before it along (" word",
// GPT-2 style); any other rune — punctuation, a newline, a space not
// followed by a word — is a piece of its own. An ordinary piece's id is
// its FNV-1a hash modulo SpecialBase.
//
// The split is prefix-stable: when b does not begin with a letter or digit
// (it begins, say, with " word", a punctuation mark or a newline) and a
// does not end inside a special token, Tokenize(a+b) is Tokenize(a)
// followed by Tokenize(b). So a prompt extended at a word boundary — a
// chat with one more turn — extends its tokens, and its KV blocks hit the
// prefix cache as a real model's would.
func Tokenize(text string) []uint32 {
	out := make([]uint32, 0, len(text)/4+1)
	forEachPiece(text, func(piece string, special int) {
		if special >= 0 {
			out = append(out, uint32(SpecialBase+special))
			return
		}
		out = append(out, PieceID(piece))
	})
	return out
}

// PieceID is the token id of an ordinary piece (not a special token).
func PieceID(piece string) uint32 {
	h := fnv.New64a()
	h.Write([]byte(piece))
	return uint32(h.Sum64() % SpecialBase)
}

func isWord(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// forEachPiece calls f with each piece of text and its special index (-1
// for an ordinary piece).
func forEachPiece(text string, f func(piece string, special int)) {
	for i := 0; i < len(text); {
		if text[i] == '<' {
			if k := specialAt(text[i:]); k >= 0 {
				f(specials[k], k)
				i += len(specials[k])
				continue
			}
		}
		r, n := utf8.DecodeRuneInString(text[i:])
		start, j := i, i+n
		if r == ' ' {
			if r2, _ := utf8.DecodeRuneInString(text[j:]); j < len(text) && isWord(r2) {
				r = r2
				j += utf8.RuneLen(r2)
			}
		}
		if isWord(r) {
			runes := 1
			for j < len(text) && runes < maxPieceRunes {
				r2, n2 := utf8.DecodeRuneInString(text[j:])
				if !isWord(r2) {
					break
				}
				j += n2
				runes++
			}
		}
		f(text[start:j], -1)
		i = j
	}
}

func specialAt(s string) int {
	for k, sp := range specials {
		if strings.HasPrefix(s, sp) {
			return k
		}
	}
	return -1
}

// outputWords is the vocabulary the mock model generates from.
var outputWords = strings.Fields(`the of and to in is that it for on with as was at by be this are from or an not have but they which
one you had all were we there can her has been if more when will would who so no time could people
my than first water call oil its now find long down day did get come made may part over new sound
take only little work know place year live me back give most very after thing our just name good
sentence man think say great where help through much before line right too mean old any same tell
boy follow came want show also around form three small set put end does another well large must big
even such because turn here why ask went men read need land different home us move try kind hand
picture again change off play spell air away animal house point page letter mother answer found
study still learn should world`)

// outputIDs maps the generated pieces' ids back to them (Detokenize).
var outputIDs = func() map[uint32]string {
	m := make(map[uint32]string, len(outputWords))
	for _, w := range outputWords {
		m[PieceID(" "+w)] = " " + w
	}
	return m
}()

// OutputSeed is the seed of a prompt's generated tokens: the same prompt
// always generates the same text.
func OutputSeed(prompt []uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range prompt {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	return h.Sum64()
}

// OutputToken returns the i-th token the mock model generates for a
// prompt with seed (OutputSeed): a word of its small vocabulary with its
// leading space, and that piece's id (Tokenize(piece) is that one id).
func OutputToken(seed uint64, i int) (id uint32, piece string) {
	x := seed + uint64(i+1)*0x9e3779b97f4a7c15 // splitmix64
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	piece = " " + outputWords[x%uint64(len(outputWords))]
	return PieceID(piece), piece
}

// Detokenize renders the tokens the mock model generates (OutputToken) and
// the special tokens; any other id (an ordinary prompt piece, which a hash
// does not invert) renders as nothing.
func Detokenize(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		if id >= SpecialBase && int(id-SpecialBase) < len(specials) {
			b.WriteString(specials[id-SpecialBase])
			continue
		}
		b.WriteString(outputIDs[id])
	}
	return b.String()
}

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// ChatPrompt renders messages with a ChatML template,
// "<|im_start|>role\ncontent<|im_end|>\n" each, and with
// addGenerationPrompt the opening of the assistant's turn,
// "<|im_start|>assistant\n". The prompt of a conversation is a prefix of
// the prompt of the conversation with more messages.
func ChatPrompt(messages []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString(TokImStart)
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(TokImEnd)
		b.WriteByte('\n')
	}
	if addGenerationPrompt {
		b.WriteString(TokImStart)
		b.WriteString("assistant\n")
	}
	return b.String()
}
