package apiserver

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

func noPartition(k indexer.PartitionKey) *httpError {
	return &httpError{http.StatusNotFound, fmt.Sprintf("no indexer for model=%s routing_group=%s", clip.N(k.Model, maxEcho), clip.N(k.Group, maxEcho))}
}

func (h *handler) query(w http.ResponseWriter, r *http.Request) {
	s := h.getScratch()
	defer h.putScratch(s)
	body, herr := h.readBody(w, r, s)
	if herr != nil {
		writeError(w, herr)
		return
	}
	req, err := decodeQuery(body, s.tokens[:0], h.cfg.MaxTokens)
	s.tokens = req.TokenIDs
	if err != nil {
		h.fail(w, r, err)
		return
	}
	k := indexer.PartitionKey{Model: req.ModelName, Group: req.RoutingGroup}
	seed := indexer.Seed(req.LoraName, req.CacheSalt)
	if h.cfg.Predicted == nil {
		s.ov, err = h.cfg.Index.MatchTokens(k, req.TokenIDs, seed, s.ov[:0])
		h.scores(w, r, s, k, err)
		return
	}
	// With predictions the hashes serve both: hash once, as MatchTokens would.
	var bs int
	if bs, err = h.cfg.Index.BlockSize(k); err == nil {
		s.hashes = indexer.HashBlocks(s.hashes[:0], req.TokenIDs, bs, seed)
		if s.ov, err = h.cfg.Index.Match(k, s.hashes, s.ov[:0]); err == nil {
			s.pred = h.cfg.Predicted.Match(k, s.hashes, h.cfg.Now(), s.pred[:0])
		}
	}
	h.scores(w, r, s, k, err)
}

func (h *handler) queryByHash(w http.ResponseWriter, r *http.Request) {
	s := h.getScratch()
	defer h.putScratch(s)
	body, herr := h.readBody(w, r, s)
	if herr != nil {
		writeError(w, herr)
		return
	}
	k, hashes, err := decodeQueryByHash(body, s.hashes[:0], h.cfg.MaxBlockHashes)
	s.hashes = hashes
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s.ov, err = h.cfg.Index.Match(k, hashes, s.ov[:0])
	if h.cfg.Predicted != nil && err == nil {
		s.pred = h.cfg.Predicted.Match(k, hashes, h.cfg.Now(), s.pred[:0])
	}
	h.scores(w, r, s, k, err)
}

// scores writes the score response for s.ov, or the match error.
func (h *handler) scores(w http.ResponseWriter, r *http.Request, s *scratch, k indexer.PartitionKey, err error) {
	var bs int
	if err == nil {
		bs, err = h.cfg.Index.BlockSize(k)
	}
	if errors.Is(err, indexer.ErrNoPartition) {
		writeError(w, noPartition(k))
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	s.out = appendScores(s.out[:0], s.ov, s.pred, uint64(bs))
	s.pred = s.pred[:0]
	writeRaw(w, http.StatusOK, s.out)
}

// appendScores appends the JSON score response for ov (sorting it) and
// the predictions pred (in rank order). Instances and ranks are in
// numeric order.
func appendScores(b []byte, ov, pred []indexer.Overlap, bs uint64) []byte {
	slices.SortFunc(ov, func(x, y indexer.Overlap) int {
		if x.Rank.WorkerID != y.Rank.WorkerID {
			return cmp.Compare(x.Rank.WorkerID, y.Rank.WorkerID)
		}
		return cmp.Compare(x.Rank.DPRank, y.Rank.DPRank)
	})
	// group returns the end of the run of ov[i]'s instance.
	group := func(i int) int {
		j := i + 1
		for j < len(ov) && ov[j].Rank.WorkerID == ov[i].Rank.WorkerID {
			j++
		}
		return j
	}
	// dp appends {"<rank>": device tokens} for ranks with a device match.
	dp := func(b []byte, g []indexer.Overlap) []byte {
		b = append(b, '{')
		n := 0
		for _, o := range g {
			if o.Device == 0 {
				continue
			}
			if n++; n > 1 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = appendUint(b, uint64(o.Rank.DPRank))
			b = append(b, `":`...)
			b = appendUint(b, uint64(o.Device)*bs)
		}
		return append(b, '}')
	}
	id := func(b []byte, o indexer.Overlap, first bool) []byte {
		if !first {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = appendUint(b, o.Rank.WorkerID)
		return append(b, `":`...)
	}

	b = append(b, `{"scores":{`...)
	first := true
	for i := 0; i < len(ov); {
		j := group(i)
		if slices.ContainsFunc(ov[i:j], func(o indexer.Overlap) bool { return o.Device > 0 }) {
			b = dp(id(b, ov[i], first), ov[i:j])
			first = false
		}
		i = j
	}
	b = append(b, `},"frequencies":[],"instances":{`...)
	first = true
	for i := 0; i < len(ov); {
		j := group(i)
		var gpu, cpu, disk uint32
		for _, o := range ov[i:j] {
			gpu, cpu, disk = max(gpu, o.Device), max(cpu, o.Host), max(disk, o.Disk)
		}
		if max(gpu, cpu, disk) == 0 {
			// Granted nothing (a hybrid model's rank whose other KV-cache
			// groups serve no hit): absent, like an instance that matches
			// nothing.
			i = j
			continue
		}
		b = id(b, ov[i], first)
		first = false
		b = append(b, `{"longest_matched":`...)
		b = appendUint(b, uint64(max(gpu, cpu, disk))*bs)
		b = append(b, `,"gpu":`...)
		b = appendUint(b, uint64(gpu)*bs)
		b = append(b, `,"dp":`...)
		b = dp(b, ov[i:j])
		b = append(b, `,"cpu":`...)
		b = appendUint(b, uint64(cpu)*bs)
		b = append(b, `,"disk":`...)
		b = appendUint(b, uint64(disk)*bs)
		b = append(b, '}')
		i = j
	}
	b = append(b, '}')
	if len(pred) > 0 {
		// {"predicted":{"<id>":{"<rank>": tokens}}}: apart from the scores,
		// which only the engines' events make.
		b = append(b, `,"predicted":{`...)
		first = true
		for i := 0; i < len(pred); {
			j := i + 1
			for j < len(pred) && pred[j].Rank.WorkerID == pred[i].Rank.WorkerID {
				j++
			}
			b = dp(id(b, pred[i], first), pred[i:j])
			first = false
			i = j
		}
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}

// appendUint is strconv.AppendUint(b, v, 10). A score response is some
// hundreds of numbers, most of them token counts below 10,000: those are
// appended from digitPairs directly, two digits at a time, without
// strconv's copy out of its own buffer or a count of the digits first
// (BenchmarkScores8K).
func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 10:
		return append(b, byte('0'+v))
	case v < 100:
		return append(b, digitPairs[2*v], digitPairs[2*v+1])
	case v < 1000:
		hi, lo := v/100, 2*(v%100)
		return append(b, byte('0'+hi), digitPairs[lo], digitPairs[lo+1])
	case v < 10000:
		hi, lo := 2*(v/100), 2*(v%100)
		return append(b, digitPairs[hi], digitPairs[hi+1], digitPairs[lo], digitPairs[lo+1])
	}
	n := 5
	for n < len(pow10u) && v >= pow10u[n] {
		n++
	}
	b = slices.Grow(b, n)
	b = b[:len(b)+n]
	d := b[len(b)-n:]
	i := n
	for v >= 100 {
		q := v / 100
		p := (v - q*100) * 2
		i -= 2
		d[i], d[i+1] = digitPairs[p], digitPairs[p+1]
		v = q
	}
	if v >= 10 { // i == 2
		d[0], d[1] = digitPairs[2*v], digitPairs[2*v+1]
	} else { // i == 1
		d[0] = byte('0' + v)
	}
	return b
}

// pow10u holds 10^n for every n with 10^n < 2^64.
var pow10u = [20]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

const digitPairs = "00010203040506070809" + "10111213141516171819" + "20212223242526272829" + "30313233343536373839" + "40414243444546474849" +
	"50515253545556575859" + "60616263646566676869" + "70717273747576777879" + "80818283848586878889" + "90919293949596979899"

// hotKeys are the keys of the hot bodies, which the lexer reads without
// allocating.
var hotKeys = []string{"token_ids", "model_name", "block_hashes", "routing_group", "lora_name", "cache_salt"}

// decodeQuery reads a /query body, appending the tokens to tokens (the
// returned request's TokenIDs, also on error, so the caller can reuse it).
func decodeQuery(body []byte, tokens []uint32, limit int) (api.QueryRequest, error) {
	req := api.QueryRequest{TokenIDs: tokens}
	var haveTokens bool
	l := jsonlex.New(body, hotKeys...)
	err := l.Document(func(key string) error {
		var err error
		switch key {
		case "token_ids":
			var isNull bool
			if isNull, err = l.Null(); !isNull && err == nil {
				req.TokenIDs, err = l.Tokens(key, tokens[:0], limit)
			}
			haveTokens = !isNull
		case "model_name":
			req.ModelName, err = l.String(key, false)
		case "routing_group":
			req.RoutingGroup, err = l.String(key, true)
		case "lora_name":
			req.LoraName, err = l.String(key, true)
		case "cache_salt":
			req.CacheSalt, err = l.String(key, true)
		default:
			err = l.Skip(clip.N(key, maxEcho), 1) // unknown: tolerated for forward compatibility
		}
		return err
	})
	switch {
	case err != nil:
		return req, lexErrorOf(err)
	case !haveTokens:
		return req, badRequest("token_ids", "required")
	case req.ModelName == "":
		return req, badRequest("model_name", "required")
	}
	if req.RoutingGroup == "" {
		req.RoutingGroup = api.DefaultRoutingGroup
	}
	return req, nil
}

// decodeQueryByHash reads a /query_by_hash body, appending the hashes to
// hashes (returned also on error, for reuse).
func decodeQueryByHash(body []byte, hashes []uint64, limit int) (indexer.PartitionKey, []uint64, error) {
	var k indexer.PartitionKey
	var have bool
	l := jsonlex.New(body, hotKeys...)
	err := l.Document(func(key string) error {
		var err error
		switch key {
		case "block_hashes":
			var isNull bool
			if isNull, err = l.Null(); !isNull && err == nil {
				hashes, err = l.Hashes(key, hashes[:0], limit)
			}
			have = !isNull
		case "model_name":
			k.Model, err = l.String(key, false)
		case "routing_group":
			k.Group, err = l.String(key, true)
		case "cache_salt":
			var isNull bool
			if isNull, err = l.Null(); !isNull && err == nil {
				err = badRequest(key, "must be omitted or null: block hashes are already salted")
			}
		default:
			err = l.Skip(clip.N(key, maxEcho), 1)
		}
		return err
	})
	switch {
	case err != nil:
		return k, hashes, lexErrorOf(err)
	case !have:
		return k, hashes, badRequest("block_hashes", "required")
	case k.Model == "":
		return k, hashes, badRequest("model_name", "required")
	}
	if k.Group == "" {
		k.Group = api.DefaultRoutingGroup
	}
	return k, hashes, nil
}
