package gvisor

import "time"

// ExportFileLimitFor is exportFileLimit for a sandbox of mem bytes using
// none of it, for tests.
func (d *Driver) ExportFileLimitFor(mem int64) int64 { return d.exportFileLimit(mem, 0) }

// SetQuitGrace sets how long runsc has after SIGQUIT, for tests.
func SetQuitGrace(d time.Duration) (restore func()) {
	old := quitGrace
	quitGrace = d
	return func() { quitGrace = old }
}
