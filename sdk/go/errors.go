package space

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Machine codes the server puts in the "error" field of an error body.
const (
	CodeInvalidArgument  = "invalid_argument"     // 400
	CodeUnauthenticated  = "unauthenticated"      // 401
	CodePermissionDenied = "permission_denied"    // 403
	CodeNotFound         = "not_found"            // 404
	CodeConflict         = "conflict"             // 409
	CodeMethodNotAllowed = "method_not_allowed"   // 405
	CodeTooLarge         = "too_large"            // 413
	CodeUpgradeRequired  = "upgrade_required"     // 426
	CodeQuotaExceeded    = "quota_exceeded"       // 429: a team's quota
	CodeRateLimited      = "rate_limited"         // 429: a team's requests per second
	CodeInternal         = "internal"             // 500
	CodeNotSupported     = "not_supported"        // 501
	CodeUnavailable      = "unavailable"          // 503
	CodeNoStorage        = "insufficient_storage" // 507: the host's disk is below its reserve
	CodeDeadlineExceeded = "deadline_exceeded"    // 504
)

// APIError is an error reported by the server:
// {"code": <status>, "error": "<machine code>", "message": "…", "state": "…"}.
type APIError struct {
	Status  int    `json:"code"`            // HTTP status
	Code    string `json:"error"`           // machine code, one of the Code… constants
	Message string `json:"message"`         // human-readable, safe to show
	State   string `json:"state,omitempty"` // a sandbox's current state, on conflicts
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = e.Code
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.State != "" {
		msg += " (state " + e.State + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrNotFound) and friends match any APIError with the
// same machine code.
func (e *APIError) Is(target error) bool {
	t, ok := target.(*APIError)
	return ok && t.Code != "" && t.Code == e.Code
}

// Sentinels for errors.Is; they match any *APIError with the same Code.
var (
	ErrInvalidArgument  = &APIError{Status: 400, Code: CodeInvalidArgument}
	ErrUnauthenticated  = &APIError{Status: 401, Code: CodeUnauthenticated}
	ErrPermissionDenied = &APIError{Status: 403, Code: CodePermissionDenied}
	ErrNotFound         = &APIError{Status: 404, Code: CodeNotFound}
	ErrConflict         = &APIError{Status: 409, Code: CodeConflict}
	ErrMethodNotAllowed = &APIError{Status: 405, Code: CodeMethodNotAllowed}
	ErrTooLarge         = &APIError{Status: 413, Code: CodeTooLarge}
	ErrUpgradeRequired  = &APIError{Status: 426, Code: CodeUpgradeRequired}
	ErrQuotaExceeded    = &APIError{Status: 429, Code: CodeQuotaExceeded}
	ErrRateLimited      = &APIError{Status: 429, Code: CodeRateLimited}
	ErrInternal         = &APIError{Status: 500, Code: CodeInternal}
	ErrNotSupported     = &APIError{Status: 501, Code: CodeNotSupported}
	ErrUnavailable      = &APIError{Status: 503, Code: CodeUnavailable}
	ErrNoStorage        = &APIError{Status: 507, Code: CodeNoStorage}
	ErrDeadlineExceeded = &APIError{Status: 504, Code: CodeDeadlineExceeded}
)

// IsInvalidArgument reports whether err is a 400 invalid_argument APIError.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsUnauthenticated reports whether err is a 401 unauthenticated APIError.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// IsPermissionDenied reports whether err is a 403 permission_denied APIError.
func IsPermissionDenied(err error) bool { return errors.Is(err, ErrPermissionDenied) }

// IsQuotaExceeded reports whether err is a 429 quota_exceeded APIError: the
// team holds as many sandboxes (or as much memory, or snapshot data) as its
// quota allows.
func IsQuotaExceeded(err error) bool { return errors.Is(err, ErrQuotaExceeded) }

// IsRateLimited reports whether err is a 429 rate_limited APIError: the
// team sent more requests per second than its quota allows (the response's
// Retry-After says when to try again; a second at most).
func IsRateLimited(err error) bool { return errors.Is(err, ErrRateLimited) }

// IsNoStorage reports whether err is a 507 insufficient_storage APIError:
// the server's disk is below its reserve (retry once space was freed).
func IsNoStorage(err error) bool { return errors.Is(err, ErrNoStorage) }

// IsNotFound reports whether err is a 404 not_found APIError.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is a 409 conflict APIError; its State field
// holds the sandbox's current state when the conflict is about state.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsTooLarge reports whether err is a 413 too_large APIError.
func IsTooLarge(err error) bool { return errors.Is(err, ErrTooLarge) }

// IsInternal reports whether err is a 500 internal APIError.
func IsInternal(err error) bool { return errors.Is(err, ErrInternal) }

// IsNotSupported reports whether err is a 501 not_supported APIError.
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }

// IsUnavailable reports whether err is a 503 unavailable APIError.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsDeadlineExceeded reports whether err is a 504 deadline_exceeded APIError.
func IsDeadlineExceeded(err error) bool { return errors.Is(err, ErrDeadlineExceeded) }

// codeForStatus is the machine code a status implies when the body has none
// (a proxy's HTML error page, an empty 502…).
func codeForStatus(status int) string {
	switch status {
	case 400:
		return CodeInvalidArgument
	case 401:
		return CodeUnauthenticated
	case 403:
		return CodePermissionDenied
	case 404:
		return CodeNotFound
	case 409:
		return CodeConflict
	case 413:
		return CodeTooLarge
	case 501:
		return CodeNotSupported
	case 502, 503:
		return CodeUnavailable
	case 504:
		return CodeDeadlineExceeded
	case 507:
		return CodeNoStorage
	}
	return CodeInternal
}

// decodeError turns a non-2xx response into an *APIError, tolerating bodies
// that are not the API's error JSON.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{}
	if json.Unmarshal(b, e) != nil || (e.Code == "" && e.Message == "") {
		e = &APIError{Message: strings.TrimSpace(string(b))}
		if len(e.Message) > 200 || strings.HasPrefix(e.Message, "<") {
			e.Message = ""
		}
	}
	e.Status = resp.StatusCode
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("%s (HTTP %d)", http.StatusText(resp.StatusCode), resp.StatusCode)
	}
	return e
}
