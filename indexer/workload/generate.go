package workload

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/prefixd/prefixd/indexer"
)

// Generate runs the traffic cfg describes and returns its events. The
// result depends only on cfg. Generate fails if cfg is invalid or the
// target cannot be reached.
func Generate(cfg Config) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := newGen(cfg)
	// A fleet that keeps evicting what it stores never reaches the target.
	limit := 50*cfg.TargetEntries + 10_000_000
	for g.entries < cfg.TargetEntries {
		if g.stats.StoredBlocks > limit {
			return nil, fmt.Errorf("workload: %d entries after storing %d blocks; target %d unreachable",
				g.entries, g.stats.StoredBlocks, cfg.TargetEntries)
		}
		g.step()
	}
	fill := len(g.events)
	for churn := g.stats.StoredBlocks + cfg.ChurnBlocks; g.stats.StoredBlocks < churn; {
		g.step()
	}
	long := g.serveLong()
	w := g.finish(long)
	w.FillEvents = fill
	return w, nil
}

// step serves one turn of a random open conversation, opening a new one
// in the slot if it is empty or finished.
func (g *gen) step() {
	slot := g.r.intn(len(g.slots))
	ci := g.slots[slot]
	if ci < 0 || g.convs[ci].next == len(g.convs[ci].turns) {
		ci = g.startConv()
		g.slots[slot] = ci
	}
	g.serve(ci)
}

// turn is one request of a conversation, in blocks of the conversation's
// path: its prompt is [0, user), of which [start, user) is the new user
// message, and its answer is [user, end).
type turn struct{ start, user, end int }

type conv struct {
	rank   int
	tokens []uint32 // every planned block, BlockSize tokens each
	seq    []uint64 // sequence hash of each planned block: its identity
	turns  []turn   // including turns inherited from a forked conversation
	next   int      // next turn to serve
	reach  int      // blocks the conversation has stored or inherited
	top    int      // its rank holds no block of the path at or above top
	stamp  uint64   // LRU stamp of its newest queue entry
}

type sysPrompt struct {
	tokens []uint32
	seq    []uint64
	ranks  []int // ranks that served it, in order
	onRank []bool
}

type lruEntry struct {
	conv  int
	stamp uint64
}

// rankCache models one rank's prefix cache. Its held blocks are always
// prefix-closed (a block is held only with its parent), and it evicts only
// blocks with no held children.
type rankCache struct {
	kids map[uint64]int32 // sequence hash of a held block → held children
	salt uint64           // per-rank engine hash salt
	lru  []lruEntry       // conversations, least recently served first; stale entries skipped
	head int
	load int // turns served
}

type gen struct {
	cfg     Config
	r       *rng
	sys     []sysPrompt
	sysCDF  []float64
	ranks   []rankCache
	convs   []*conv
	slots   []int // open conversation per slot, -1 if none
	recent  []int // ring of recently started conversations, fork sources
	nrecent int
	events  []Event
	stats   Stats
	entries int
	stamp   uint64
	scratch []uint64
}

func newGen(cfg Config) *gen {
	g := &gen{cfg: cfg, r: newRNG(cfg.Seed)}
	nr := cfg.Ranks()
	g.ranks = make([]rankCache, nr)
	for i := range g.ranks {
		g.ranks[i] = rankCache{kids: make(map[uint64]int32), salt: g.r.next()}
	}
	sum := 0.0
	for i := range cfg.SystemPrompts {
		n := g.r.between(cfg.SystemPromptBlocksMin, cfg.SystemPromptBlocksMax)
		tok := g.r.tokens(make([]uint32, 0, n*cfg.BlockSize), n*cfg.BlockSize, cfg.Vocab)
		g.sys = append(g.sys, sysPrompt{tokens: tok, seq: g.seqHashes(nil, tok), onRank: make([]bool, nr)})
		sum += math.Pow(float64(i+1), -cfg.SystemPromptSkew)
		g.sysCDF = append(g.sysCDF, sum)
	}
	for i := range g.sysCDF {
		g.sysCDF[i] /= sum
	}
	g.slots = make([]int, cfg.Active)
	for i := range g.slots {
		g.slots[i] = -1
	}
	g.recent = make([]int, 1024)
	return g
}

// seqHashes appends the sequence hashes of tokens' blocks to seq, chaining
// from seq's last element if there is one.
func (g *gen) seqHashes(seq []uint64, tokens []uint32) []uint64 {
	return seqHashes(seq, tokens, g.cfg.BlockSize, &g.scratch)
}

func seqHashes(seq []uint64, tokens []uint32, bs int, scratch *[]uint64) []uint64 {
	buf := (*scratch)[:0]
	if len(seq) > 0 {
		buf = append(buf, seq[len(seq)-1])
	}
	buf = indexer.HashBlocks(buf, tokens, bs, indexer.BaseSeed)
	out := indexer.HashSequence(buf[len(buf):], buf) // reuses buf's spare capacity, else allocates
	if len(seq) > 0 {
		out = out[1:]
	}
	seq = append(seq, out...)
	*scratch = buf
	return seq
}

func (g *gen) pickSys() int {
	if len(g.sys) == 0 {
		return -1
	}
	return sort.SearchFloat64s(g.sysCDF, g.r.float())
}

// lessLoaded returns the less loaded of ranks a and b.
func (g *gen) lessLoaded(a, b int) int {
	if g.ranks[b].load < g.ranks[a].load {
		return b
	}
	return a
}

// planTurn draws the user and answer blocks of one turn.
func (g *gen) planTurn() (user, answer int) {
	n := g.r.between(g.cfg.TurnBlocksMin, g.cfg.TurnBlocksMax)
	answer = min(int(float64(n)*g.cfg.DecodeShare+0.5), n-1)
	return n - answer, answer
}

// newConv makes a conversation on rank whose path starts with prefix
// (tokens and sequence hashes, already known to the fleet), keeps the
// inherited turns, and appends new turns of plan[i] = {user, answer}
// blocks.
func (g *gen) newConv(rank int, prefixTok []uint32, prefixSeq []uint64, inherited []turn, plan [][2]int) int {
	bs := g.cfg.BlockSize
	p := len(prefixSeq)
	total := p
	for _, t := range plan {
		total += t[0] + t[1]
	}
	c := &conv{rank: rank, next: len(inherited), reach: p, top: p}
	c.tokens = make([]uint32, p*bs, total*bs)
	copy(c.tokens, prefixTok)
	c.seq = make([]uint64, p, total)
	copy(c.seq, prefixSeq)
	c.turns = append(make([]turn, 0, len(inherited)+len(plan)), inherited...)
	pos := p
	for _, t := range plan {
		c.turns = append(c.turns, turn{start: pos, user: pos + t[0], end: pos + t[0] + t[1]})
		pos += t[0] + t[1]
	}
	c.tokens = g.r.tokens(c.tokens, (total-p)*bs, g.cfg.Vocab)
	c.seq = g.seqHashes(c.seq, c.tokens[p*bs:])
	g.convs = append(g.convs, c)
	g.stats.Conversations++
	return len(g.convs) - 1
}

// startConv opens a new conversation: a fork of a recent one, or a fresh
// one on a system prompt.
func (g *gen) startConv() int {
	if g.nrecent > 0 && g.r.float() < g.cfg.BranchProb {
		if ci, ok := g.fork(); ok {
			g.remember(ci)
			return ci
		}
	}
	nt := g.r.between(g.cfg.TurnsMin, g.cfg.TurnsMax)
	plan := make([][2]int, nt)
	for i := range plan {
		plan[i][0], plan[i][1] = g.planTurn()
	}
	nr := len(g.ranks)
	s := g.pickSys()
	var rank int
	switch {
	case s >= 0 && len(g.sys[s].ranks) > 0 && g.r.float() < g.cfg.StickyProb:
		on := g.sys[s].ranks
		rank = g.lessLoaded(on[g.r.intn(len(on))], on[g.r.intn(len(on))])
	default:
		rank = g.lessLoaded(g.r.intn(nr), g.r.intn(nr))
	}
	var ci int
	if s >= 0 {
		sp := &g.sys[s]
		if !sp.onRank[rank] {
			sp.onRank[rank] = true
			sp.ranks = append(sp.ranks, rank)
		}
		ci = g.newConv(rank, sp.tokens, sp.seq, nil, plan)
	} else {
		ci = g.newConv(rank, nil, nil, nil, plan)
	}
	g.remember(ci)
	return ci
}

func (g *gen) remember(ci int) {
	g.recent[g.nrecent%len(g.recent)] = ci
	g.nrecent++
}

// fork starts a conversation that regenerates the answer of, or edits the
// user message of, a served turn of a recent conversation, on its rank.
func (g *gen) fork() (int, bool) {
	p := g.convs[g.recent[g.r.intn(min(g.nrecent, len(g.recent)))]]
	if p.next == 0 {
		return 0, false
	}
	k := g.r.intn(p.next)
	nt := g.r.between(1, g.cfg.TurnsMax-k)
	plan := make([][2]int, nt)
	for i := range plan {
		plan[i][0], plan[i][1] = g.planTurn()
	}
	bs := g.cfg.BlockSize
	pt := p.turns[k]
	var ci int
	if g.r.intn(2) == 0 { // regenerate: same prompt, new answer
		plan[0][0] = 0
		ci = g.newConv(p.rank, p.tokens[:pt.user*bs], p.seq[:pt.user], p.turns[:k], plan)
		g.convs[ci].turns[k].start = pt.start
	} else { // edit: new user message at turn k
		ci = g.newConv(p.rank, p.tokens[:pt.start*bs], p.seq[:pt.start], p.turns[:k], plan)
	}
	g.stats.Forks++
	return ci, true
}

// heldPrefix returns how many leading blocks of seq rank holds. Held
// blocks are prefix-closed, so the last held block ends the run.
func (rc *rankCache) heldPrefix(seq []uint64) int {
	for i := len(seq) - 1; i >= 0; i-- {
		if _, ok := rc.kids[seq[i]]; ok {
			return i + 1
		}
	}
	return 0
}

// serve runs the next turn of conversation ci on its rank.
func (g *gen) serve(ci int) {
	c := g.convs[ci]
	rc := &g.ranks[c.rank]
	t := c.turns[c.next]
	m := rc.heldPrefix(c.seq[:t.user])
	g.store(c, m, t.user, g.cfg.PrefillChunkBlocks)
	for b := t.user; b < t.end; b++ {
		g.store(c, b, b+1, 1)
	}
	c.next++
	c.reach = max(c.reach, t.end)
	c.top = max(c.top, t.end)
	rc.load++
	g.stats.Turns++
	g.stamp++
	c.stamp = g.stamp
	rc.lru = append(rc.lru, lruEntry{conv: ci, stamp: g.stamp})
}

// store stores blocks [from, to) of c's path on its rank, in events of at
// most chunk blocks, evicting first where the rank is full. The rank holds
// [0, from) and nothing at or above from.
func (g *gen) store(c *conv, from, to, chunk int) {
	rc := &g.ranks[c.rank]
	bs := g.cfg.BlockSize
	for from < to {
		n := min(to-from, chunk)
		g.makeRoom(c, from, n)
		hashes := make([]uint64, n)
		for i := range n {
			s := c.seq[from+i]
			hashes[i] = engineHash(rc.salt, s)
			rc.kids[s] = 1
		}
		rc.kids[c.seq[from+n-1]] = 0
		st := indexer.Stored{
			Hashes:    hashes,
			Tokens:    c.tokens[from*bs : (from+n)*bs : (from+n)*bs],
			BlockSize: bs,
			Tier:      indexer.TierDevice,
			Seed:      indexer.BaseSeed,
		}
		if from > 0 {
			rc.kids[c.seq[from-1]]++
			st.Parent, st.HasParent = engineHash(rc.salt, c.seq[from-1]), true
		}
		g.events = append(g.events, Event{Rank: rankOf(c.rank, g.cfg.DPRanks), Op: indexer.Op{Kind: indexer.OpStore, Store: st}})
		g.stats.StoreEvents++
		g.stats.StoredBlocks += n
		g.entries += n
		from += n
	}
}

// makeRoom evicts from c's rank so that n more blocks fit, keeping c's
// held prefix [0, from), and publishes the evictions as one remove event.
func (g *gen) makeRoom(c *conv, from, n int) {
	rc := &g.ranks[c.rank]
	need := len(rc.kids) + n - g.cfg.RankCapacityBlocks
	if g.cfg.RankCapacityBlocks == 0 || need <= 0 {
		return
	}
	// A virtual child pins the held prefix: its last block is then not a
	// leaf, and every earlier block has a held child already.
	if from > 0 {
		rc.kids[c.seq[from-1]]++
	}
	var out []uint64
	for need > 0 && rc.head < len(rc.lru) {
		e := rc.lru[rc.head]
		v := g.convs[e.conv]
		if e.stamp != v.stamp {
			rc.head++
			continue
		}
		i, done := v.top-1, false
		for need > 0 {
			if i < 0 {
				done = true
				break
			}
			s := v.seq[i]
			k, ok := rc.kids[s]
			if ok && k > 0 {
				done = true // shared with a held continuation, or pinned
				break
			}
			if ok {
				delete(rc.kids, s)
				if i > 0 {
					rc.kids[v.seq[i-1]]--
				}
				out = append(out, engineHash(rc.salt, s))
				need--
			}
			i--
		}
		v.top = i + 1
		if done || i < 0 {
			rc.head++
		}
	}
	if rc.head > 1024 && 2*rc.head > len(rc.lru) {
		rc.lru = append(rc.lru[:0], rc.lru[rc.head:]...)
		rc.head = 0
	}
	if from > 0 {
		rc.kids[c.seq[from-1]]--
	}
	if len(out) == 0 {
		return
	}
	g.events = append(g.events, Event{
		Rank: rankOf(c.rank, g.cfg.DPRanks),
		Op:   indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: out, Tier: indexer.TierDevice}},
	})
	g.stats.RemoveEvents++
	g.stats.RemovedBlocks += len(out)
	g.entries -= len(out)
}

// serveLong serves each long prompt (a system prompt and a document) on
// LongPromptRanks distinct ranks, each answering differently, and returns
// the prompts' tokens.
func (g *gen) serveLong() [][]uint32 {
	bs := g.cfg.BlockSize
	var long [][]uint32
	for range g.cfg.LongPrompts {
		var tok []uint32
		var seq []uint64
		if s := g.pickSys(); s >= 0 {
			tok = append(tok, g.sys[s].tokens...)
			seq = append(seq, g.sys[s].seq...)
		}
		p := len(seq)
		tok = g.r.tokens(tok, (g.cfg.LongPromptBlocks-p)*bs, g.cfg.Vocab)
		seq = g.seqHashes(seq, tok[p*bs:])
		// A partial Fisher–Yates shuffle picks the ranks.
		perm := make([]int, len(g.ranks))
		for i := range perm {
			perm[i] = i
		}
		for i := range g.cfg.LongPromptRanks {
			j := i + g.r.intn(len(perm)-i)
			perm[i], perm[j] = perm[j], perm[i]
			_, answer := g.planTurn()
			ci := g.newConv(perm[i], tok, seq, nil, [][2]int{{0, answer}})
			g.convs[ci].turns[0].start = p
			g.serve(ci)
		}
		long = append(long, tok)
	}
	return long
}

func (g *gen) finish(long [][]uint32) *Workload {
	w := &Workload{
		BlockSize: g.cfg.BlockSize,
		Events:    g.events,
		seed:      g.cfg.Seed,
		vocab:     g.cfg.Vocab,
		msgMin:    g.cfg.TurnBlocksMin,
		msgMax:    g.cfg.TurnBlocksMax,
	}
	st := g.stats
	st.Ranks = len(g.ranks)
	var all []uint64
	for ri := range g.ranks {
		w.Ranks = append(w.Ranks, rankOf(ri, g.cfg.DPRanks))
		set := make([]uint64, 0, len(g.ranks[ri].kids))
		for s := range g.ranks[ri].kids {
			set = append(set, s)
		}
		slices.Sort(set)
		w.final = append(w.final, set)
		all = append(all, set...)
		st.Entries += len(set)
	}
	slices.Sort(all)
	st.Blocks = len(slices.Compact(all))
	bs := g.cfg.BlockSize
	for _, c := range g.convs {
		held := g.ranks[c.rank].heldPrefix(c.seq[:c.reach])
		w.histories = append(w.histories, history{tokens: c.tokens[: c.reach*bs : c.reach*bs], held: held})
	}
	w.Stats = st
	for _, tok := range long {
		w.Long = append(w.Long, Prompt{Tokens: tok, Holders: w.Holders(tok)})
	}
	return w
}
