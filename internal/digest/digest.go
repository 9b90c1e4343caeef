// Package digest names files by content: the hex SHA-256 the caches, the
// agent store and the checkpoint stamps key on.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
)

// File is the hex SHA-256 of the file at path.
func File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
