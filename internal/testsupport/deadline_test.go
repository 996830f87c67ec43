package testsupport

import (
	"context"
	"testing"
)

func TestContextFollowsTheTestDeadline(t *testing.T) {
	ctx, cancel := Context(t)
	defer cancel()
	d, ok := t.Deadline()
	got, has := ctx.Deadline()
	if ok != has || (ok && !got.Equal(d.Add(-DeadlineMargin))) {
		t.Fatalf("context deadline %v (%v), test deadline %v (%v)", got, has, d, ok)
	}
	var inner context.Context
	t.Run("ends with its test", func(t *testing.T) {
		var c context.CancelFunc
		inner, c = Context(t)
		defer c()
		if inner.Err() != nil {
			t.Fatalf("ended early: %v", inner.Err())
		}
	})
	if inner.Err() == nil {
		t.Fatal("the context outlived its test")
	}
}
