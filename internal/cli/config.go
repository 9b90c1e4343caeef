package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spacesandbox/space/internal/server"
)

// clientConfig is where the CLI finds a server and how it authenticates.
type clientConfig struct {
	URL    string
	Key    string
	KeyErr error // why no key was found in the data dir, for hints
}

// resolveClientConfig finds the server: flags first, then SPACE_URL and
// SPACE_API_KEY, then the files a local server leaves in its data dir
// (--data, SPACE_DATA, /var/lib/space): serve.json for the URL and api-key
// for the admin key. A missing key is not an error (healthz needs none).
func resolveClientConfig(flagURL, flagKey, flagData string, getenv func(string) string) (clientConfig, error) {
	var cfg clientConfig
	data := firstNonEmpty(flagData, getenv("SPACE_DATA"), server.DefaultDataDir)

	cfg.Key = firstNonEmpty(flagKey, getenv("SPACE_API_KEY"))
	if cfg.Key == "" {
		b, err := os.ReadFile(filepath.Join(data, server.KeyFile))
		switch {
		case err != nil:
			cfg.KeyErr = fmt.Errorf("cannot read %s: %w", filepath.Join(data, server.KeyFile), unwrapPathError(err))
		default:
			cfg.Key = strings.TrimSpace(string(b))
		}
	}

	cfg.URL = firstNonEmpty(flagURL, getenv("SPACE_URL"))
	if cfg.URL != "" {
		return cfg, nil
	}
	path := filepath.Join(data, server.ServeFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("no server to talk to: pass --url or set SPACE_URL, or start `space serve` (cannot read %s: %w)", path, unwrapPathError(err))
	}
	var sf struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(b, &sf); err != nil || sf.URL == "" {
		return cfg, fmt.Errorf("%s has no server URL", path)
	}
	cfg.URL = sf.URL
	return cfg, nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// parseKV parses repeated K=V flags into a map; what is a name for messages.
func parseKV(what string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad --%s %q: want KEY=VALUE", what, p)
		}
		m[k] = v
	}
	return m, nil
}
