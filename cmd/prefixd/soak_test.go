package main

import (
	"strings"
	"testing"
)

func TestSoakRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"soak", "--duration", "5s"}, "--duration"},
		{[]string{"soak", "--duration", "1m", "--sample", "20s"}, "--sample"},
		{[]string{"soak", "--rate", "0"}, "--rate"},
		{[]string{"soak", "--warmup", "20m"}, "--warmup"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { checkServeError(t, tc.args, nil, tc.want) })
	}
}
