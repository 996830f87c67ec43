// Package coordinator owns worker selection, reservations and decode-first
// disaggregated coordination. It does no I/O: it declares the small
// interfaces it needs (overlap source, clock, random source).
//
// Implemented by the coordinator issue; the package exists so the layout is
// fixed.
package coordinator
