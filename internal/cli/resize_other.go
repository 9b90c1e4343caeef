//go:build !unix

package cli

// watchResize is a no-op where terminals send no SIGWINCH.
func watchResize(fn func()) (stop func()) { return func() {} }
