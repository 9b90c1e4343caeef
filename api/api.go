// Package api holds space's API specifications: the public REST API
// (openapi.yaml, served at /v1/openapi.yaml).
package api

import _ "embed"

// OpenAPI is the public REST API specification.
//
//go:embed openapi.yaml
var OpenAPI []byte
