module github.com/spacesandbox/space/sdk/go

go 1.24

require github.com/coder/websocket v1.8.15
