package gvisor

// ExportFileLimitFor is exportFileLimit for a sandbox of mem bytes using
// none of it, for tests.
func (d *Driver) ExportFileLimitFor(mem int64) int64 { return d.exportFileLimit(mem, 0) }
