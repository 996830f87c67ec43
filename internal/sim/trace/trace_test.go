package trace

import (
	"bytes"
	"compress/gzip"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMooncake: the shipped trace is what its README says.
func TestMooncake(t *testing.T) {
	reqs, err := Mooncake()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 {
		t.Fatalf("%d requests, want 12,031", len(reqs))
	}
	in, out := 0, 0
	for i, r := range reqs {
		in += r.InputLength
		out += r.OutputLength
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("request %d arrives before request %d", i, i-1)
		}
	}
	if avg := math.Round(float64(in) / float64(len(reqs))); avg != 12035 {
		t.Errorf("average input %v tokens, want 12,035", avg)
	}
	if avg := math.Round(float64(out) / float64(len(reqs))); avg != 343 {
		t.Errorf("average output %v tokens, want 343", avg)
	}
	if last := reqs[len(reqs)-1].Arrival; last < 58*time.Minute || last > time.Hour {
		t.Errorf("last arrival %v, want about an hour in", last)
	}
	// The first two requests share their first block, and so their first
	// 512 tokens and no more.
	a, b := reqs[0].Tokens(nil, 32000), reqs[1].Tokens(nil, 32000)
	if len(a) != reqs[0].InputLength || len(b) != reqs[1].InputLength {
		t.Fatalf("token counts %d, %d; want %d, %d", len(a), len(b), reqs[0].InputLength, reqs[1].InputLength)
	}
	if !slices.Equal(a[:BlockTokens], b[:BlockTokens]) || slices.Equal(a[BlockTokens:2*BlockTokens], b[BlockTokens:2*BlockTokens]) {
		t.Error("the shared first block expands differently, or the distinct second the same")
	}
	for _, tok := range a {
		if tok >= 32000 {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
}

// TestRead: a trace in the format, gzipped or not; bad lines are refused
// naming the line and the field, without echoing it.
func TestRead(t *testing.T) {
	good := "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [7, 8]}\n\n" +
		"{\"timestamp\": 1.5, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [7]}\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(good))
	zw.Close()
	for name, in := range map[string][]byte{"plain": []byte(good), "gzip": gz.Bytes()} {
		reqs, err := Read(bytes.NewReader(in))
		if err != nil || len(reqs) != 2 || reqs[1].Arrival != 1500*time.Microsecond || reqs[0].HashIDs[1] != 8 {
			t.Fatalf("%s: %+v %v", name, reqs, err)
		}
		if got := reqs[0].Tokens(nil, 100); len(got) != 600 || !slices.Equal(got[:512], reqs[1].Tokens(nil, 100)) {
			t.Fatalf("%s: tokens of the shared block differ", name)
		}
	}
	huge := strings.Repeat("9", 3<<20)
	for _, c := range []struct{ in, want string }{
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7]}`, "line 1: hash_ids: 1 ids for input_length 600, want 2"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5}`, "line 1: hash_ids: must be an array"},
		{`{"input_length": 600, "output_length": 5, "hash_ids": [7, 8]}`, "line 1: timestamp: required"},
		{`{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}`, "timestamp: -1 is out of range"},
		{`{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`, "input_length: 0 is out of range"},
		{`{"timestamp": 0, "input_length": 99999999, "output_length": 5, "hash_ids": [1]}`, "input_length: 99999999 is out of range"},
		{`{"timestamp": 0, "input_length": 600, "output_length": -5, "hash_ids": [7, 8]}`, "output_length: -5 is out of range"},
		{`{"timestamp": "0", "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}`, "timestamp: must be float64"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, -8]}`, "hash_ids: must be an array of non-negative integers"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [` + strings.Repeat("1,", 500) + `1]}`, "hash_ids: more than the 2 ids"},
		{`[1, 2]`, "line 1: not a JSON object"},
		{good + "{oops", "line 4: not a JSON object"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [` + huge + `]}`, "line 1: longer than 1048576 bytes"},
	} {
		_, err := Read(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60s: error %v, want %q", c.in, err, c.want)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("%.60s: error echoes the input (%d bytes)", c.in, len(err.Error()))
		}
	}
}
