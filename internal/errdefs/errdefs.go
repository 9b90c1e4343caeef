// Package errdefs owns the error classes shared by every layer of space.
//
// Code returns sentinel errors wrapped with context (fmt.Errorf("...: %w",
// errdefs.ErrNotFound)); the HTTP layer maps a class to a status code in one
// place. Messages wrapped around a class are meant to be safe to show a user;
// internal detail belongs in logs.
package errdefs

import (
	"errors"
	"fmt"
)

// The error classes. Each maps to one HTTP status and one machine code.
var (
	ErrInvalidArgument  = errors.New("invalid argument")     // 400 invalid_argument
	ErrUnauthenticated  = errors.New("unauthenticated")      // 401 unauthenticated
	ErrPermissionDenied = errors.New("permission denied")    // 403 permission_denied
	ErrNotFound         = errors.New("not found")            // 404 not_found
	ErrConflict         = errors.New("conflict")             // 409 conflict (illegal state transition, already exists)
	ErrTooLarge         = errors.New("too large")            // 413 too_large
	ErrMethodNotAllowed = errors.New("method not allowed")   // 405 method_not_allowed
	ErrUpgradeRequired  = errors.New("upgrade required")     // 426 upgrade_required
	ErrQuotaExceeded    = errors.New("quota exceeded")       // 429 quota_exceeded (a team's limit)
	ErrRateLimited      = errors.New("rate limited")         // 429 rate_limited (a team's requests per second; retry after a second)
	ErrNoStorage        = errors.New("insufficient storage") // 507 insufficient_storage (the host's disk is below its reserve)
	ErrUnavailable      = errors.New("unavailable")          // 503 unavailable (not ready, retry later)
	ErrNotSupported     = errors.New("not supported")        // 501 not_supported (driver lacks a capability)
	ErrDeadline         = errors.New("deadline exceeded")    // 504 deadline_exceeded
	ErrInternal         = errors.New("internal error")       // 500 internal
)

// Classes lists every class with its machine code and HTTP status, in the
// order they are tested by Classify.
var Classes = []struct {
	Err    error
	Code   string
	Status int
}{
	{ErrInvalidArgument, "invalid_argument", 400},
	{ErrUnauthenticated, "unauthenticated", 401},
	{ErrPermissionDenied, "permission_denied", 403},
	{ErrNotFound, "not_found", 404},
	{ErrConflict, "conflict", 409},
	{ErrMethodNotAllowed, "method_not_allowed", 405},
	{ErrTooLarge, "too_large", 413},
	{ErrUpgradeRequired, "upgrade_required", 426},
	{ErrQuotaExceeded, "quota_exceeded", 429},
	{ErrRateLimited, "rate_limited", 429},
	{ErrNotSupported, "not_supported", 501},
	{ErrUnavailable, "unavailable", 503},
	{ErrNoStorage, "insufficient_storage", 507},
	{ErrDeadline, "deadline_exceeded", 504},
	{ErrInternal, "internal", 500},
}

// Classify returns the machine code and HTTP status of err's class;
// unclassified errors are internal (500).
func Classify(err error) (code string, status int) {
	for _, c := range Classes {
		if errors.Is(err, c.Err) {
			return c.Code, c.Status
		}
	}
	return "internal", 500
}

// FromCode returns the class whose machine code is code (ErrInternal if unknown).
func FromCode(code string) error {
	for _, c := range Classes {
		if c.Code == code {
			return c.Err
		}
	}
	return ErrInternal
}

// Newf returns an error of class cls with a formatted, user-safe message.
func Newf(cls error, format string, args ...any) error {
	return &classed{cls: cls, msg: fmt.Sprintf(format, args...)}
}

// classed carries a user-facing message without repeating the class name.
type classed struct {
	cls error
	msg string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.cls }

// Convenience constructors.
func InvalidArgument(format string, args ...any) error {
	return Newf(ErrInvalidArgument, format, args...)
}
func NotFound(format string, args ...any) error     { return Newf(ErrNotFound, format, args...) }
func Conflict(format string, args ...any) error     { return Newf(ErrConflict, format, args...) }
func NotSupported(format string, args ...any) error { return Newf(ErrNotSupported, format, args...) }
func Unavailable(format string, args ...any) error  { return Newf(ErrUnavailable, format, args...) }
