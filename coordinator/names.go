package coordinator

import (
	"fmt"
	"slices"
	"strings"
)

// The names of Role, Order, FailurePolicy and PolicyKind are their text
// forms (encoding.TextMarshaler and encoding.TextUnmarshaler): the CLI
// flags, the daemon's configuration and the HTTP API all parse them here,
// and each value has one spelling.
var (
	roleNames    = []string{RoleAggregated: "aggregated", RolePrefill: "prefill", RoleDecode: "decode"}
	orderNames   = []string{DecodeFirst: "decode-first", PrefillFirst: "prefill-first"}
	failureNames = []string{FreeDecode: "free_decode", BypassOnDecode: "bypass_on_decode"}
	policyNames  = []string{PolicyOff: "off", PolicyISLBounding: "isl_bounding", PolicyPrefillLoad: "prefill_load", PolicyISLOrLoad: "isl_or_load"}
)

// A NameError is a name that is not one of a type's names.
type NameError struct {
	// Type is what the name should have named: "role", "order",
	// "prefill-failure policy" or "policy".
	Type string
	Name string
	// Names are the valid names, in the order of their values.
	Names []string
}

func (e *NameError) Error() string { return fmt.Sprintf("%s %q: want %s", e.Type, e.Name, e.Want()) }

// Want renders the valid names as "a or b", "a, b or c".
func (e *NameError) Want() string {
	n := e.Names
	if len(n) < 2 {
		return strings.Join(n, "")
	}
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

func nameOf[T ~uint8](names []string, v T, typ string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, uint8(v))
}

func marshalName[T ~uint8](names []string, v T, typ string) ([]byte, error) {
	if int(v) < len(names) {
		return []byte(names[v]), nil
	}
	return nil, fmt.Errorf("coordinator: %s(%d) has no name", typ, uint8(v))
}

func parseName[T ~uint8](names []string, text []byte, typ string) (T, error) {
	if i := slices.Index(names, string(text)); i >= 0 {
		return T(i), nil
	}
	return 0, &NameError{Type: typ, Name: string(text), Names: slices.Clone(names)}
}

func (r Role) String() string { return nameOf(roleNames, r, "Role") }

// MarshalText implements encoding.TextMarshaler: aggregated, prefill or decode.
func (r Role) MarshalText() ([]byte, error) { return marshalName(roleNames, r, "Role") }

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is a
// *NameError. The empty name is not a role: callers that default it say so.
func (r *Role) UnmarshalText(text []byte) (err error) {
	*r, err = parseName[Role](roleNames, text, "role")
	return err
}

func (o Order) String() string { return nameOf(orderNames, o, "Order") }

// MarshalText implements encoding.TextMarshaler: decode-first or prefill-first.
func (o Order) MarshalText() ([]byte, error) { return marshalName(orderNames, o, "Order") }

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is a *NameError.
func (o *Order) UnmarshalText(text []byte) (err error) {
	*o, err = parseName[Order](orderNames, text, "order")
	return err
}

func (f FailurePolicy) String() string { return nameOf(failureNames, f, "FailurePolicy") }

// MarshalText implements encoding.TextMarshaler: free_decode or bypass_on_decode.
func (f FailurePolicy) MarshalText() ([]byte, error) {
	return marshalName(failureNames, f, "FailurePolicy")
}

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is a *NameError.
func (f *FailurePolicy) UnmarshalText(text []byte) (err error) {
	*f, err = parseName[FailurePolicy](failureNames, text, "prefill-failure policy")
	return err
}

func (k PolicyKind) String() string { return nameOf(policyNames, k, "PolicyKind") }

// MarshalText implements encoding.TextMarshaler: off, isl_bounding,
// prefill_load or isl_or_load.
func (k PolicyKind) MarshalText() ([]byte, error) { return marshalName(policyNames, k, "PolicyKind") }

// UnmarshalText implements encoding.TextUnmarshaler; an unknown name is a *NameError.
func (k *PolicyKind) UnmarshalText(text []byte) (err error) {
	*k, err = parseName[PolicyKind](policyNames, text, "policy")
	return err
}
