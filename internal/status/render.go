package status

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/prefixd/prefixd/api"
)

// RenderWorkers writes one line per worker rank.
func RenderWorkers(w io.Writer, ws []api.WorkerInfo) error {
	slices.SortFunc(ws, func(a, b api.WorkerInfo) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup), cmp.Compare(a.InstanceID, b.InstanceID))
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tMODEL\tGROUP\tROLE\tRANK\tSTATUS\tLAST SEQ\tBLOCKS\tDEGRADED\tENDPOINT")
	for _, wi := range ws {
		ranks := make([]uint32, 0, len(wi.Listeners))
		for r := range wi.Listeners {
			ranks = append(ranks, r)
		}
		slices.Sort(ranks)
		for _, r := range ranks {
			l := wi.Listeners[r]
			seq := "-"
			if l.LastSeq != nil {
				seq = strconv.FormatUint(*l.LastSeq, 10)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%v\t%s\n", wi.InstanceID, wi.ModelName, wi.RoutingGroup,
				cmp.Or(string(wi.Role), "aggregated"), r, l.Status, seq, l.Blocks, l.Degraded, l.Endpoint)
		}
	}
	return tw.Flush()
}

// RenderScores writes one line per matching worker rank, in tokens,
// longest device match first.
func RenderScores(w io.Writer, s api.ScoreResponse) error {
	type row struct {
		id                   uint64
		rank                 uint32
		gpu, cpu, disk, best uint64
	}
	var rows []row
	for id, inst := range s.Instances {
		for r, tok := range inst.DP {
			rows = append(rows, row{id, r, tok, inst.CPU, inst.Disk, inst.LongestMatched})
		}
		if len(inst.DP) == 0 {
			rows = append(rows, row{id, 0, 0, inst.CPU, inst.Disk, inst.LongestMatched})
		}
	}
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(b.gpu, a.gpu), cmp.Compare(a.id, b.id), cmp.Compare(a.rank, b.rank))
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tRANK\tGPU TOKENS\tWORKER CPU\tWORKER DISK\tLONGEST")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\n", r.id, r.rank, r.gpu, r.cpu, r.disk, r.best)
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no worker holds the first block)")
	}
	return tw.Flush()
}
