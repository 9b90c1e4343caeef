package agent

import "testing"

// Node must still start when the agent could not write its preload: the
// host's NODE_OPTIONS naming it is dropped, a caller's own is kept.
func TestDropNodePreload(t *testing.T) {
	missing := func(string) bool { return false }
	present := func(string) bool { return true }
	env := map[string]string{"NODE_OPTIONS": "--require " + NodePreload, "A": "b"}
	if !dropNodePreload(env, missing) || env["NODE_OPTIONS"] != "" || env["A"] != "b" {
		t.Errorf("missing preload: env %v", env)
	}
	env = map[string]string{"NODE_OPTIONS": "--require " + NodePreload}
	if dropNodePreload(env, present) || env["NODE_OPTIONS"] == "" {
		t.Errorf("present preload was dropped: %v", env)
	}
	env = map[string]string{"NODE_OPTIONS": "--max-old-space-size=64"}
	if dropNodePreload(env, missing) || env["NODE_OPTIONS"] != "--max-old-space-size=64" {
		t.Errorf("the caller's NODE_OPTIONS was touched: %v", env)
	}
	if dropNodePreload(nil, missing) {
		t.Error("nil env")
	}
}
