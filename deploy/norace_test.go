//go:build !race

package deploy

const raceBuild = false
