package catalog

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// DefaultPrefix is the key prefix of prefixd's records in etcd.
const DefaultPrefix = "/prefixd/v1"

// Key identifies one worker record: the worker in one partition. The same
// worker_id may be registered in several routing groups of a model, as
// separate records.
type Key struct {
	Model    string
	Group    string
	WorkerID uint64
}

func (k Key) String() string {
	return fmt.Sprintf("worker %d (model %q, group %q)", k.WorkerID, clip.String(k.Model), clip.String(k.Group))
}

// Path returns the record's store key under prefix (DefaultPrefix if
// empty): <prefix>/workers/<model>/<group>/<worker_id decimal>, with model
// and group path-escaped (so "meta-llama/Llama-3-8B" is one segment,
// "meta-llama%2FLlama-3-8B").
func (k Key) Path(prefix string) string {
	return ModelPrefix(prefix, k.Model) + url.PathEscape(k.Group) + "/" + strconv.FormatUint(k.WorkerID, 10)
}

// ParseKey is the inverse of Key.Path: it accepts only canonical keys
// under prefix (the escaping Path produces, a decimal id without leading
// zeros), so every record has exactly one key.
func ParseKey(prefix, path string) (Key, error) {
	rest, ok := strings.CutPrefix(path, WorkersPrefix(prefix))
	if !ok {
		return Key{}, fmt.Errorf("key %q is not under %q", clip.String(path), WorkersPrefix(prefix))
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return Key{}, fmt.Errorf("key %q: want <model>/<group>/<worker_id> after %q", clip.String(path), WorkersPrefix(prefix))
	}
	model, err1 := url.PathUnescape(parts[0])
	group, err2 := url.PathUnescape(parts[1])
	id, err3 := strconv.ParseUint(parts[2], 10, 64)
	k := Key{Model: model, Group: group, WorkerID: id}
	if err1 != nil || err2 != nil || err3 != nil || model == "" || group == "" || k.Path(prefix) != path {
		return Key{}, fmt.Errorf("key %q is not a canonical worker key", clip.String(path))
	}
	return k, nil
}

// NormPrefix returns prefix without trailing slashes, DefaultPrefix if
// empty.
func NormPrefix(prefix string) string {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

// WorkersPrefix is the prefix every worker key starts with.
func WorkersPrefix(prefix string) string { return NormPrefix(prefix) + "/workers/" }

// IDClaimPath is the key that claims worker id for one record: its value is
// the record's path, and it carries the record's lease. Puts and updates
// check it in the same transaction, so an id has one record. It lives
// outside WorkersPrefix: lists and watches of records never see it.
func IDClaimPath(prefix string, id uint64) string {
	return NormPrefix(prefix) + "/ids/" + strconv.FormatUint(id, 10)
}

// ModelPrefix is the prefix of every key of one model.
func ModelPrefix(prefix, model string) string {
	return WorkersPrefix(prefix) + url.PathEscape(model) + "/"
}
