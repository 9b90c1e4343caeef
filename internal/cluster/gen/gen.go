// Package gen holds the Go code generated from api/node/v1/node.proto: the
// RPC between the control plane and its nodes. Regenerate with
// `go generate ./internal/cluster/gen` (needs protoc on PATH, e.g.
// Debian's protobuf-compiler; the plugins come from the module proxy at the
// pinned versions).
package gen

//go:generate go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//go:generate go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
//go:generate sh -c "cd ../../.. && protoc -I api -I /usr/include --plugin=protoc-gen-go=$(go env GOPATH)/bin/protoc-gen-go --plugin=protoc-gen-connect-go=$(go env GOPATH)/bin/protoc-gen-connect-go --go_out=. --go_opt=module=github.com/spacesandbox/space --connect-go_out=. --connect-go_opt=module=github.com/spacesandbox/space api/node/v1/node.proto"
