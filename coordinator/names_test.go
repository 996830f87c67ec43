package coordinator

import (
	"encoding"
	"errors"
	"testing"
)

// TestNames: every Role, Order, FailurePolicy and PolicyKind has one name,
// which parses back to it; other names, the other spelling of a name
// included, are a *NameError listing the valid ones.
func TestNames(t *testing.T) {
	for _, c := range []struct {
		v     textual
		name  string
		parse func(string) (textual, error)
	}{
		{RoleAggregated, "aggregated", parseRole},
		{RolePrefill, "prefill", parseRole},
		{RoleDecode, "decode", parseRole},
		{DecodeFirst, "decode-first", parseOrder},
		{PrefillFirst, "prefill-first", parseOrder},
		{FreeDecode, "free_decode", parseFailure},
		{BypassOnDecode, "bypass_on_decode", parseFailure},
		{PolicyOff, "off", parseKind},
		{PolicyISLBounding, "isl_bounding", parseKind},
		{PolicyPrefillLoad, "prefill_load", parseKind},
		{PolicyISLOrLoad, "isl_or_load", parseKind},
	} {
		b, err := c.v.MarshalText()
		if err != nil || string(b) != c.name || c.v.String() != c.name {
			t.Errorf("%#v: MarshalText %q %v, String %q; want %q", c.v, b, err, c.v.String(), c.name)
		}
		if got, err := c.parse(c.name); err != nil || got != c.v {
			t.Errorf("parse %q: %v %v", c.name, got, err)
		}
	}
	for _, c := range []struct {
		parse func(string) (textual, error)
		name  string
		want  string
	}{
		{parseRole, "encoder", `role "encoder": want aggregated, prefill or decode`},
		{parseRole, "", `role "": want aggregated, prefill or decode`},
		{parseOrder, "decode_first", `order "decode_first": want decode-first or prefill-first`},
		{parseFailure, "free-decode", `prefill-failure policy "free-decode": want free_decode or bypass_on_decode`},
		{parseKind, "isl-bounding", `policy "isl-bounding": want off, isl_bounding, prefill_load or isl_or_load`},
	} {
		_, err := c.parse(c.name)
		var ne *NameError
		if !errors.As(err, &ne) || ne.Name != c.name || err.Error() != c.want {
			t.Errorf("parse %q: %v, want %s", c.name, err, c.want)
		}
	}
	if b, err := Role(9).MarshalText(); err == nil || Role(9).String() != "Role(9)" {
		t.Errorf("Role(9): MarshalText %q %v, String %q", b, err, Role(9).String())
	}
}

type textual interface {
	encoding.TextMarshaler
	String() string
}

func parseRole(s string) (textual, error) {
	var v Role
	err := v.UnmarshalText([]byte(s))
	return v, err
}
func parseOrder(s string) (textual, error) {
	var v Order
	err := v.UnmarshalText([]byte(s))
	return v, err
}
func parseFailure(s string) (textual, error) {
	var v FailurePolicy
	err := v.UnmarshalText([]byte(s))
	return v, err
}
func parseKind(s string) (textual, error) {
	var v PolicyKind
	err := v.UnmarshalText([]byte(s))
	return v, err
}
