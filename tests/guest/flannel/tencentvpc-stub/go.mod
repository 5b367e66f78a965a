// A stand-in for Tencent Cloud's VPC SDK, whose module is not served here: flannel's main package
// imports every backend, its Tencent VPC one included. The lab runs flannel's vxlan backend; this
// package only lets flannel build, and every call fails.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.21
