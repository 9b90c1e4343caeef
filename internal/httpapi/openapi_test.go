package httpapi

import (
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/spacesandbox/space/api"
)

// The specification SDK generators and users read matches what the server
// registers: every operation of an API key is documented under its method
// and path, nothing documented is missing from the server, every one
// documents 401, and every one counted against the team's requests per
// second documents that 429 (the rate limit was missing from all of them).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]yaml.Node `yaml:"paths"` // method (or "parameters") → operation
		Components struct {
			Responses map[string]yaml.Node `yaml:"responses"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	type operation struct {
		Summary   string `yaml:"summary"`
		Responses map[string]struct {
			Ref string `yaml:"$ref"`
		} `yaml:"responses"`
	}
	var spec struct {
		Paths      map[string]map[string]operation
		Components struct{ Responses map[string]yaml.Node }
	}
	spec.Components.Responses = doc.Components.Responses
	spec.Paths = map[string]map[string]operation{}
	for path, items := range doc.Paths {
		spec.Paths[path] = map[string]operation{}
		for m, n := range items {
			if m == "parameters" {
				continue
			}
			var op operation
			if err := n.Decode(&op); err != nil {
				t.Fatalf("%s %s: %v", m, path, err)
			}
			spec.Paths[path][m] = op
		}
	}
	a := New(Config{})
	if len(a.routes) < 40 {
		t.Fatalf("only %d routes recorded", len(a.routes))
	}
	const ref = "#/components/responses/"
	registered := map[string]bool{} // "method path" as the spec writes them
	for _, r := range a.routes {
		method, path, ok := strings.Cut(r.pattern, " ")
		if !ok {
			method, path = "", r.pattern
		}
		path = strings.ReplaceAll(path, "...}", "}")
		ops, ok := spec.Paths[path]
		if !ok {
			t.Errorf("%s: path not in openapi.yaml", r.pattern)
			continue
		}
		methods := []string{strings.ToLower(method)}
		if method == "" { // every method: each one documented is checked
			methods = methods[:0]
			for m := range ops {
				methods = append(methods, m)
			}
		}
		for _, m := range methods {
			registered[m+" "+path] = true
			op, ok := ops[m]
			if !ok {
				t.Errorf("%s: %s not documented under %s", r.pattern, m, path)
				continue
			}
			if op.Responses["401"].Ref != ref+"Unauthenticated" {
				t.Errorf("%s %s: no 401 Unauthenticated", m, path)
			}
			got := op.Responses["429"].Ref
			admin := strings.HasSuffix(op.Summary, "(admin)") // admin keys are not counted
			switch {
			case (!r.limited || admin) && got == ref+"RateLimited":
				t.Errorf("%s %s: documents the rate limit, which does not count it", m, path)
			case admin:
			case r.limited && got != ref+"RateLimited" && got != ref+"QuotaOrRateLimited":
				t.Errorf("%s %s: 429 is %q, want RateLimited (or QuotaOrRateLimited where a quota applies too)", m, path, got)
			}
		}
	}
	public := map[string]bool{"/healthz": true, "/metrics": true, "/v1/openapi.yaml": true} // served without a key
	for path, ops := range spec.Paths {
		for m := range ops {
			if registered[m+" "+path] || public[path] {
				continue
			}
			t.Errorf("openapi.yaml documents %s %s, which the server does not serve", m, path)
		}
	}
	// Every response referenced exists.
	for path, ops := range spec.Paths {
		for m, op := range ops {
			for code, r := range op.Responses {
				if name, ok := strings.CutPrefix(r.Ref, ref); ok {
					if _, ok := spec.Components.Responses[name]; !ok {
						t.Errorf("%s %s %s: response %s not defined", m, path, code, name)
					}
				}
			}
		}
	}
	if !slices.ContainsFunc(a.routes, func(r route) bool { return !r.limited }) {
		t.Error("no route outside the rate limit (the ports proxy is)")
	}
}
