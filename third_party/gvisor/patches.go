// Package gvisorpatches holds the patches `make runsc` applies to the
// pinned gVisor source before building runsc, and their digest, which
// names the build (internal/driver/gvisor.BuildName) so that changed
// patches make a new build.
package gvisorpatches

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sort"
)

//go:embed *.patch
var files embed.FS

// Digest is the first 12 hex digits of the SHA-256 of the patches' bytes,
// concatenated in name order: what the Makefile computes with
// `cat third_party/gvisor/*.patch | sha256sum`.
func Digest() string {
	names, _ := fs.Glob(files, "*.patch")
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := files.ReadFile(n)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
